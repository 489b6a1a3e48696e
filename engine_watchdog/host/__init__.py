"""Host helpers every layer above may use: tool lookup, bounded subprocesses, private files
(tools.py), and children that die with the watchdog (pdeathsig.py). Standard library only."""
