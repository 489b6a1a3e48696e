"""``python -m engine_watchdog.sim``: the simulator without the main CLI."""

from engine_watchdog.sim.cli import sim_command

if __name__ == "__main__":
    sim_command(prog_name="engine-watchdog sim")
