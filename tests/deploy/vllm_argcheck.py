"""Parse engine command lines with vLLM's own parser; run under the vLLM venv's python.

stdin: a JSON object {id: argv}; stdout: {id: {"error": str|null, "model_tag": str|null}}.
The parser is ``make_arg_parser`` from vllm/entrypoints/launchers/cli_args.py, what both
``vllm serve`` (vllm/entrypoints/cli/serve.py) and the api_server module build, and
``parse_args`` is the call they make: an option it does not know is an error, and a stray
string lands in the positional ``model_tag``, which ``vllm serve`` then loads as the model.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> int:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    results = {}
    for key, argv in json.load(sys.stdin).items():
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(argv)
        except SystemExit:
            lines = err.getvalue().strip().splitlines() or ["(no message)"]
            results[key] = {"error": lines[-1], "model_tag": None}
            continue
        results[key] = {"error": None, "model_tag": ns.model_tag}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
