"""Unattended operation: queue health (the `status` command and the UI), alerts to a Slack-compatible webhook."""
