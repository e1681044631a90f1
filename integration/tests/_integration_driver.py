"""A driver process for the re-attach tests: one tiny detached run, its options as JSON.

    python _integration_driver.py OUTPUT_DIR '{"run": {"id": "r1"}, "placement": "separate"}'

runs :func:`sc_trainer.testing.tiny_config` with those overrides through ``TaskRunner`` and
prints the result as one JSON line (the final step, the startup seconds). The tests start
it, SIGKILL it through an injected driver fault, and start it again to re-attach.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from sc_trainer import RunConfig, TaskRunner
from sc_trainer.testing import tiny_config


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    output_dir, raw = argv
    overrides = json.loads(raw)
    overrides["run"] = RunConfig(**overrides.get("run", {}))
    result = TaskRunner(tiny_config(Path(output_dir), **overrides)).run()
    summary = {
        "final_step": result.final_step,
        "startup_seconds": result.startup_seconds,
        "checkpoint": str(result.checkpoint),
    }
    print(json.dumps(summary))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
