"""What the measurement package's layout promises: the assets load without the report, old import paths still work."""

from __future__ import annotations

import subprocess
import sys


def test_loading_the_assets_does_not_load_the_report() -> None:
    # A fresh interpreter: this test process has long loaded the report for other tests.
    code = (
        "import sys, marketing_pipelines.measurement.assets; "
        "print('marketing_pipelines.measurement.report' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_package_level_names_are_their_homes() -> None:
    from marketing_pipelines.measurement import LoadCounts, MeasurementReport, measurement_report, render
    from marketing_pipelines.measurement.events.write import LoadCounts as loads_home
    from marketing_pipelines.measurement.report.build import measurement_report as report_home
    from marketing_pipelines.measurement.report.model import MeasurementReport as model_home
    from marketing_pipelines.measurement.report.rendering import render as render_home

    assert (LoadCounts, MeasurementReport, measurement_report, render) == (
        loads_home,
        model_home,
        report_home,
        render_home,
    )
