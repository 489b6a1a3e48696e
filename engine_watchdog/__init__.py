"""engine-watchdog: catches LLM serving engines that hang silently."""

__version__ = "0.1.0"
