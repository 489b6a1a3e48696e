"""Host helpers every layer above may use: tool lookup, bounded subprocesses, private files
(tools.py), children that die with the watchdog (pdeathsig.py), and the format of every line
the process writes (logs.py). Standard library only (and core)."""
