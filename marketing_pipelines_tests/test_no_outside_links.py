"""Nothing an outside party wrote becomes a link: not in the UI's funnel Markdown, not in an alert.

``unlinkable`` is checked over every form a Markdown renderer or a chat autolinker links (schemes, ``www.``,
bare domains, IPv4 and IPv6 addresses, e-mail addresses, the host redaction leaves of a URL); the funnel and
an alert are checked with the same patterns; and the real webserver's page, rendered by headless Chromium,
is checked for ``<a>`` elements pointing where an events file said.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import unicodedata
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.measurement.events.files import load_events_file
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.report.rendering import funnel_markdown
from marketing_pipelines.monitoring.alerts import Alert, CheckChange, FailedRun, format_alert, mrkdwn
from marketing_pipelines.redact import unlinkable
from marketing_pipelines_tests.factories import add_campaign, replace_rollup_day
from marketing_pipelines_tests.machine import require_or_skip
from marketing_pipelines_tests.measurement.generated import materialize_rollup
from marketing_pipelines_tests.processes import REPO_ROOT, child_env, dagster_bin, free_port, running, start, wait_for

# What any renderer or autolinker named in docs/OPERATIONS.md needs to make a link, in ASCII or with the
# full stops IDNA maps to "." (U+3002, U+FF0E, U+FF61).
_DOT = r"[.\u3002\uff0e\uff61]"
AUTOLINKABLE = {
    "scheme": re.compile(r"(?i)(?<![\w+-])[a-z][a-z0-9+.-]*:\S|://"),
    "www": re.compile(rf"(?i)www{_DOT}"),
    "domain": re.compile(rf"(?i)[\w-]{_DOT}[a-z]{{2,}}\b"),
    "ipv4": re.compile(rf"\d{_DOT}\d+{_DOT}\d"),
    "ipv6": re.compile(r"(?i)[0-9a-f]*:[0-9a-f]*:"),
    "email": re.compile(rf"(?i)[\w.+-]+[@\uff20][\w-]+{_DOT}\w"),
    "markup": re.compile(r"(?<!\\)[<\[]|&#|&[a-z]+;"),
}

HOSTILE = [
    # GitHub-flavoured Markdown and every chat: a URL with its scheme
    "http://evil.example/x",
    "HTTPS://EVIL.EXAMPLE",
    "ftp://evil.example/pub",
    # a URL whose path redaction hid: its host is left
    "https://evil.example/***",
    # schemes without "//"
    "mailto:a@evil.example",
    "javascript:alert(document.cookie)",
    "data:text/html;base64,PHNjcmlwdD4=",
    "xmpp:a@evil.example",
    # www. and bare domains (Slack links "evil.example" alone)
    "www.evil.example",
    "evil.example/x",
    "evil.example",
    "go to evil.example:8443/admin",
    # IP literals, in and out of a URL
    "1.2.3.4/admin",
    "http://1.2.3.4:8080/",
    "2001:db8::1",
    "http://[2001:db8::1]/x",
    "fe80::1%eth0",
    # e-mail addresses
    "a@evil.example",
    "first.last+tag@mail.evil.example",
    # IDNA's other full stops, which a browser resolves as "."
    "evil\u3002example",
    "www\uff0eevil\uff0eexample",
    "evil\uff61example",
    # a scheme after a dot, and after an underscore
    "x.javascript:alert(1)",
    "x_http://localhost",
]


_IDNA_DOTS = str.maketrans(dict.fromkeys("\u3002\uff0e\uff61", "."))
_RATIO = str.maketrans({"\u2236": ":"})  # U+2236 has no compatibility mapping; U+2024 maps to "."


def autolinkable(text: str) -> list[str]:
    return [name for name, pattern in AUTOLINKABLE.items() if name != "markup" and pattern.search(text)]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_unlinkable_leaves_no_form_any_autolinker_links(hostile: str) -> None:
    assert autolinkable(hostile), "the case must be hostile to begin with"
    shown = unlinkable(hostile)
    assert autolinkable(shown) == []
    # Still the same text to a reader: each replacement is a look-alike of what it replaced.
    assert len(shown) == len(hostile)
    assert unicodedata.normalize("NFKC", shown.translate(_RATIO)) == hostile.translate(_IDNA_DOTS)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # ordinary text keeps its sentence punctuation, names their colons, times theirs
        ("done. Next: retry", "done. Next: retry"),
        ("execution_queue:due_lag at 10:30", "execution_queue:due_lag at 10:30"),
        # the dot between labels and the scheme's colon are what change
        ("see https://evil.example/***", "see https\u2236//evil\u2024example/***"),
        ("www.evil.example", "www\u2024evil\u2024example"),
        ("evil\uff0eexample", "evil\u2024example"),
    ],
)
def test_unlinkable_changes_only_what_links(text: str, shown: str) -> None:
    assert unlinkable(text) == shown


def test_the_dot_is_one_no_host_name_can_hold() -> None:
    # UTS #46 (browsers' host mapping) maps U+FF0E to "." and refuses U+2024: "evil\u2024example" names no host.
    idna = pytest.importorskip("idna")
    assert idna.encode("evil\uff0eexample", uts46=True) == b"evil.example"
    with pytest.raises(idna.IDNAError):
        idna.encode(unlinkable("evil.example"), uts46=True)


DAY = date(2026, 11, 26)
# Stage names as an events file may carry them; the browser test looks for links to these hosts.
STAGES = ["http://evil.example/x", "www.evil.example", "mailto:a@evil.example", "evil.example/x", "1.2.3.4/admin"]
LINKED_HOSTS = ("evil", "1.2.3.4", "1\u20242\u20243\u20244")


def write_events(path: Path, campaign: str) -> Path:
    events = [
        {
            "event_id": f"e{i}-{n}",
            "campaign_id": campaign,
            "stage": stage,
            "event_type": "https://evil.example/type",
            "occurred_at": f"{DAY}T10:0{n}:00Z",
            "actor_id": f"actor-{n}",
        }
        for i, stage in enumerate(STAGES)
        for n in range(len(STAGES) - i)
    ]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_the_funnel_markdown_shows_stage_names_from_an_events_file_as_text(engine: sa.Engine, tmp_path: Path) -> None:
    add_campaign(engine, "alpha")
    assert load_events_file(engine, write_events(tmp_path / "events.jsonl", "alpha")).loaded
    replace_rollup_day(engine, DAY)
    with engine.connect() as conn:
        text = funnel_markdown(conn, DAY)
    rows = [line for line in text.splitlines() if line.startswith("| alpha |")]
    assert len(rows) == len(STAGES)
    for row in rows:
        assert autolinkable(row) == [], row
        assert not AUTOLINKABLE["markup"].search(row), row
    assert "| alpha | www\u2024evil\u2024example | 4 | 4 |" in text
    assert "| alpha | http\u2236//evil\u2024example/x | 5 | 5 | - |" in text


def test_a_funnel_cell_cannot_put_a_dot_back_with_a_character_reference(engine: sa.Engine, tmp_path: Path) -> None:
    add_campaign(engine, "alpha")
    path = tmp_path / "events.jsonl"
    event = {"event_id": "e", "campaign_id": "alpha", "event_type": "t", "occurred_at": f"{DAY}T10:00:00Z"}
    path.write_text(json.dumps({**event, "stage": "www&period;evil&#46;example"}) + "\n")
    load_events_file(engine, path)
    replace_rollup_day(engine, DAY)
    with engine.connect() as conn:
        text = funnel_markdown(conn, DAY)
    assert "| alpha | www\\&period;evil\\&\\#46;example |" in text


def test_no_alert_text_a_receiver_or_model_wrote_is_autolinkable() -> None:
    at = datetime(2026, 12, 3, tzinfo=UTC)
    for hostile in HOSTILE:
        assert autolinkable(mrkdwn(hostile)) == [], hostile
    reason = " ".join(HOSTILE)
    alert = Alert([FailedRun("0123456789abcdef", "job", at, reason)], [CheckChange("q:x", at, True, True, reason)])
    text = format_alert(alert, location="evil.example")
    assert autolinkable(text) == [], text


# --- the real webserver, rendered by headless Chromium ------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Dagster's UI shows a materialization's Markdown inline in the asset's events view when it is shorter than this.
UI_INLINE_MARKDOWN_CHARS = 1000
_ANCHOR = re.compile(r"<a\b([^>]*)>(.*?)</a>", re.DOTALL | re.IGNORECASE)


def chromium(*args: str, profile: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout, check=False)


def _server_up(client: httpx.Client) -> bool:
    try:
        return client.get("/server_info").status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.slow
def test_the_ui_renders_hostile_stage_names_as_text_not_links(tmp_path: Path, sqlite_template: Path) -> None:
    if CHROMIUM is None:
        require_or_skip("chromium is not installed (Debian: apt-get install -y chromium)")
    home = tmp_path / "dagster_home"
    home.mkdir()
    # The project's instance config, without the community pop-up that would cover the page in the screenshot.
    config = (REPO_ROOT / "dagster.yaml").read_text()
    (home / "dagster.yaml").write_text(f"{config}\nnux:\n  enabled: false\n")
    app_db = tmp_path / "app.db"
    shutil.copy(sqlite_template, app_db)
    db_url = f"sqlite:///{app_db}"
    engine = get_engine(db_url)
    add_campaign(engine, "alpha")
    load_events_file(engine, write_events(tmp_path / "events.jsonl", "alpha"))
    engine.dispose()
    # The run the user's would be: the rollup asset, materialized into the instance the webserver reads.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = materialize_rollup(db_url, instance, DAY)
        assert result.success
    [materialization] = [m for m in result.get_asset_materialization_events() if m.asset_key == ROLLUP_KEY]
    funnel = materialization.materialization.metadata["funnel"].value
    assert isinstance(funnel, str)
    assert len(funnel) < UI_INLINE_MARKDOWN_CHARS, "the UI would hide it behind a button"

    port = free_port()
    env = child_env(DAGSTER_HOME=str(home), MARKETING_DATABASE_URL=db_url)
    argv = [dagster_bin("dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    page = f"http://127.0.0.1:{port}/assets/measurement_daily_rollup?view=events&partition={DAY}"
    with running([]) as children, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        children.append(start("dagster-webserver", argv, env, tmp_path))
        wait_for("dagster-webserver to answer /server_info", lambda: _server_up(client), 90, children)
        dumped = chromium("--virtual-time-budget=30000", "--dump-dom", page, profile=tmp_path / "profile")
        chromium(
            "--virtual-time-budget=30000",
            "--window-size=1400,1100",
            f"--screenshot={tmp_path / 'funnel.png'}",
            page,
            profile=tmp_path / "profile-shot",
        )
    dom = dumped.stdout
    (tmp_path / "funnel.html").write_text(dom)
    # The funnel rendered: its table, with the stage names in it as text.
    assert "First-party funnel of" in dom, f"the page did not render the funnel; see {tmp_path / 'funnel.html'}"
    # No <a> whose address or text holds a host from the file, written either way.
    links = [(attrs, inner) for attrs, inner in _ANCHOR.findall(dom) if any(h in attrs + inner for h in LINKED_HOSTS)]
    assert links == []
    assert "www\u2024evil\u2024example" in dom and "1\u20242\u20243\u20244/admin" in dom
