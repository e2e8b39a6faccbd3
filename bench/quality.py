"""The order quality report: ``python bench/quality.py [options]`` is
``python -m fastshard quality [options]`` (see fastshard/_quality_report.py)."""

import sys

from fastshard import _quality_report

if __name__ == "__main__":
    _quality_report.main(sys.argv[1:])
