"""``python -m sim.rtl.cocotb_tb JOB``: internal, the subprocess :func:`run_cocotb` starts."""

import argparse
import json
import sys

from . import build_and_test

parser = argparse.ArgumentParser(description="internal: build and run one cocotb job")
parser.add_argument("job")
sys.exit(build_and_test(json.loads(parser.parse_args().job)))
