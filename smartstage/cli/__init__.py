"""The `smartstage` command, on top of every other layer: optimize, diff, explain, verify, demo.

    smartstage optimize model.meta -o optimized.meta --html report.html
"""

from smartstage.cli.main import main

__all__ = ["main"]
