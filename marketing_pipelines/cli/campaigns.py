"""``marketing-pipelines campaigns``: add and list campaigns."""

from __future__ import annotations

import click

from marketing_pipelines.cli.common import FriendlyGroup, emit_rows, json_option, ready_conn
from marketing_pipelines.db.campaigns import Campaign, add_campaign, list_campaigns


@click.group(cls=FriendlyGroup)
def campaigns() -> None:
    """Add and list campaigns."""


@campaigns.command("add")
@click.argument("campaign_id")
@click.option("--name", required=True, help="Display name.")
@click.option("--owner", required=True, help="Who runs the campaign.")
@click.option("--utm-campaign", default=None, help="utm_campaign value that maps site analytics to it.")
@click.option("--github-repo", default=None, help="owner/name whose release downloads and traffic count for it.")
@click.option("--pypi-package", default=None, help="PyPI project whose downloads count for it.")
@click.option("--npm-package", default=None, help="npm package whose downloads count for it.")
def campaigns_add(
    campaign_id: str,
    name: str,
    owner: str,
    utm_campaign: str | None,
    github_repo: str | None,
    pypi_package: str | None,
    npm_package: str | None,
) -> None:
    """Add a campaign.

    \b
    Example:
      marketing-pipelines campaigns add spring-launch --name "Spring launch" --owner ana \\
        --utm-campaign spring26 --github-repo acme/widget
    """
    with ready_conn() as conn:
        add_campaign(conn, Campaign(campaign_id, name, owner, utm_campaign, github_repo, pypi_package, npm_package))
    click.echo(f"added campaign {campaign_id}")


@campaigns.command("list")
@json_option
def campaigns_list(as_json: bool) -> None:
    """List campaigns.

    \b
    Example:
      marketing-pipelines campaigns list --json
    """
    with ready_conn() as conn:
        rows = [c.__dict__ for c in list_campaigns(conn)]
    emit_rows(rows, ["id", "name", "owner", "utm_campaign", "github_repo", "pypi_package", "npm_package"], as_json)
