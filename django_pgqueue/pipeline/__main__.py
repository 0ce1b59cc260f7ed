"""``python -m django_pgqueue.pipeline {export,stats,prune,enqueue}`` (also under spark-submit)."""

import sys

from django_pgqueue.pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
