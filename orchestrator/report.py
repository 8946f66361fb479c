"""`python -m orchestrator.report`: plots and a health summary of a run directory
(the code lives in `orchestrator.observe.report`)."""
import sys

from orchestrator.observe.report import main

if __name__ == "__main__":
    sys.exit(main())
