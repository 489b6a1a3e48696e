"""The command line (cli/main.py is the console script's entry point).

The console script's SIGINT handler for its start is installed by the package itself, in
engine_watchdog/__init__.py: the first of our code the console script runs (it was here, one
package import later).
"""
