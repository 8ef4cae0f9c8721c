"""The measurement assets' keys, and the one check key evaluated outside the assets' runs.

Here rather than beside the assets so the sensors, the checks, the freshness sensor and the demo can
name an asset without loading the module that defines it.
"""

import dagster as dg

ROLLUP_KEY = dg.AssetKey("measurement_daily_rollup")
SITE_KEY = dg.AssetKey("site_analytics_daily")
DOWNLOADS_KEY = dg.AssetKey("github_release_downloads_daily")

# Evaluated by measurement_freshness_sensor each interval (freshness.py); a rollup run skips its step.
TODAY_IS_CURRENT_KEY = dg.AssetCheckKey(ROLLUP_KEY, "today_is_current")
