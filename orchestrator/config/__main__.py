"""`python -m orchestrator.config --reference`: the config reference (docs/config.md), markdown."""
import sys

from orchestrator.config import Config
from orchestrator.config_reference import reference

if sys.argv[1:] != ["--reference"]:
    print("usage: python -m orchestrator.config --reference  (prints the config reference, "
          "markdown)", file=sys.stderr)
    sys.exit(2)
sys.stdout.write(reference(Config))
