"""The rollup: the daily rollup (``daily``), its weekly sketch index (``weekly``), the UTC day (``event_days``)
and the days whose events arrived after their rollup (``late``). Import each name from its module.
"""
