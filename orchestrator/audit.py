"""`python -m orchestrator.audit`: the promises a run must keep, read from its directory (the code
lives in `orchestrator.run.audit`)."""
import sys

from orchestrator.run.audit import main

if __name__ == "__main__":
    sys.exit(main())
