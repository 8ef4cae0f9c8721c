"""Input tokens and input cost of a queue of agent runs of one agent, with Anthropic prompt caching on and off.

For each agent (``--agents``) and each setting of ``AnthropicModel.prompt_caching`` (on, off), side by side in one
invocation, a run-worker process executes ``--runs`` queued runs of the agent one after another through
``agent_run_job``, against its own fake Anthropic server (``marketing_pipelines_tests/agents/fake_anthropic_server.py``:
prompt caching as documented, 1,024-token minimum, 5-minute TTL, tools then system then messages). The fake scripts
each run as one tool call per read tool, then a final answer: four model calls a run.

Printed per agent and setting: model calls, input tokens billed at the full price, cache reads, cache writes, and
the input cost with caching against the same queue without it, at Anthropic's price ratios (input 1.0, cache read
0.1, cache write 1.25 for the 5-minute TTL).

``measurement_analyst`` as shipped has a system prompt and tool definitions of about 570 tokens (the fake's count,
characters / 4): under the minimum, nothing is cached and the markers change nothing. ``measurement_analyst_playbook``
is the same agent with a longer system prompt (``_fake_anthropic_runs.PLAYBOOK_AGENT``), past the minimum.

    python benchmarks/prompt_caching.py
    python benchmarks/prompt_caching.py --runs 20 --agents measurement_analyst_playbook --database sqlite
"""

from __future__ import annotations

import argparse
import contextlib

from _common import print_table
from _fake_anthropic_runs import PLAYBOOK_AGENT, claim, queue_runs, stage, start_workers, stop_workers

from marketing_pipelines.agents.catalog import TOOLS
from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.base import neutral_tools
from marketing_pipelines_tests.agents.fake_anthropic_server import FakeAnthropic, Limits, tokens_of

READ_PRICE, WRITE_PRICE = 0.1, 1.25
# Far above what the queue asks for: this measures tokens, not limits.
UNBOUND = Limits(requests=100_000, input_tokens=100_000_000, output_tokens=100_000_000)
AGENTS = ("measurement_analyst", PLAYBOOK_AGENT.name)


def prefix_tokens(agent: str) -> int:
    """The system prompt and tool definitions of ``agent``, in the fake's tokens: what caching could reuse."""
    from _fake_anthropic_runs import register_playbook_agent

    from marketing_pipelines.agents.catalog import AGENTS as CATALOG

    register_playbook_agent()
    definition = CATALOG[agent]
    tools = neutral_tools([TOOLS[name].spec for name in definition.tools])
    return tokens_of(definition.system) + sum(tokens_of(t) for t in tools)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="agent runs in each queue (default 10)")
    parser.add_argument("--agents", nargs="+", choices=AGENTS, default=list(AGENTS))
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--timeout", type=float, default=600, help="seconds the queues may take (default 600)")
    args = parser.parse_args()
    if not 1 <= args.runs <= 200:
        parser.error("--runs must be between 1 and 200")
    if "prompt_caching" not in AnthropicModel.model_fields:
        raise SystemExit("AnthropicModel has no prompt_caching field: nothing to compare")

    cases = [(agent, caching) for agent in args.agents for caching in (True, False)]
    fakes = [FakeAnthropic(limits=UNBOUND) for _ in cases]
    with stage(args.database) as stage_, contextlib.ExitStack() as servers:
        for fake in fakes:
            servers.enter_context(fake.running())
        # The client's own limits out of the way too (only the fake's usage is measured).
        extra = {"MARKETING_MAX_MODEL_CALLS_PER_MINUTE": "100000"}
        envs = [stage_.env(fake, **extra) for fake in fakes]
        queues = [queue_runs(stage_, agent, args.runs, 600) for agent, _ in cases]
        claimed = iter(claim(stage_, envs[0], [i for queue in queues for i in queue]))
        shares = [[next(claimed) for _ in queue] for queue in queues]
        # As the launchpad gives a resource's config: the key and base URL from the environment, as deployed.
        resources = [
            {
                "anthropic_model": {
                    "config": {
                        "api_key": {"env": "ANTHROPIC_API_KEY"},
                        "base_url": {"env": "ANTHROPIC_BASE_URL"},
                        "prompt_caching": caching,
                    }
                }
            }
            for _, caching in cases
        ]
        processes, barrier, results = start_workers(shares, envs, resources)
        barrier.wait()
        outcomes = [results.get(timeout=args.timeout) for _ in processes]
        stop_workers(processes, 60)

    rows, costs = [], {}
    for (agent, caching), fake in zip(cases, fakes, strict=True):
        usage = fake.stats()["usage"]
        full, read, write = (
            usage.get("input_tokens", 0),
            usage.get("cache_read_input_tokens", 0),
            usage.get("cache_creation_input_tokens", 0),
        )
        costs[(agent, caching)] = full + READ_PRICE * read + WRITE_PRICE * write
        calls = fake.stats()["answers"].get("200", 0)
        rows.append(
            [agent, prefix_tokens(agent), "on" if caching else "off", calls, full, read, write, full + read + write]
        )
    for row, (agent, caching) in zip(rows, cases, strict=True):
        without = costs[(agent, False)]
        row.append(costs[(agent, caching)] / without if without else float("nan"))
    ran = sum(r for r, _ in outcomes)
    succeeded = sum(s for _, s in outcomes)
    print_table(
        f"prompt caching over a queue of {args.runs} runs per agent ({args.database}); "
        f"cost ratio at input 1.0 / read {READ_PRICE} / write {WRITE_PRICE}",
        [
            "agent",
            "system+tools tokens",
            "caching",
            "model calls",
            "input full price",
            "cache reads",
            "cache writes",
            "input total",
            "input cost / without caching",
        ],
        rows,
    )
    print(f"\nruns: {succeeded} of {ran} succeeded")
    if succeeded != ran:
        raise SystemExit("some agent runs did not succeed")


if __name__ == "__main__":
    main()
