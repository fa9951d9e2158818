"""A stand-in for a vLLM process tree under ``kvtool record``, for the fault tests (tests/vllm/test_record_faults.py).

``driver``: what a user's driver script (or ``vllm serve``'s front end) is: it starts the engine as a child process
and waits for it.  ``engine``: what vLLM's engine-core process is to the recorder: it opens the recording exactly as
the plugin does inside vLLM (:func:`kvtool.vllm.recorder.plugin.open_recording`, from the same environment variables
that ``kvtool record`` sets), writes ``ROWS`` rows per engine step through the real recorder and writer thread, and
closes the recording on SIGTERM or at the end, as vLLM's engine core does (SystemExit, then the atexit close).  Only
the scheduler hooks are missing, which tests/vllm/test_recorder.py checks on their own.

    python record_fault_engine.py driver|engine STATE_DIR STEPS ROWS STEP_S

The engine writes its pid to STATE_DIR/engine.pid and, after each step's rows are handed to the writer,
the step number to STATE_DIR/steps (so a test knows how far it got before it killed something).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def driver(args: list[str]) -> int:
    code = subprocess.Popen([sys.executable, __file__, "engine", *args]).wait()
    return 128 - code if code < 0 else code  # an engine killed by signal N: 128 + N, as a shell says


def engine(state: Path, steps: int, rows: int, step_s: float) -> int:
    from kvtool.vllm.recorder.plugin import EngineFacts, open_recording, options_from_env

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # vLLM's engine core: SystemExit, then its shutdown
    options = options_from_env(os.environ)
    assert options is not None, "KVTOOL_RECORD is not set: run under kvtool record"
    facts = EngineFacts(
        vllm_version="0.32.0",
        dp_rank=0,
        dp_size=1,
        block_size=16,
        num_blocks=1024,
        groups=(("FullAttentionSpec", 16),),
        request_ids_randomized=False,
    )
    recorder, _close = open_recording(facts, options)
    (state / "engine.pid").write_text(str(os.getpid()))
    for step in range(1, steps + 1):
        recorder.new_step()
        for i in range(rows):
            rid = f"req-{step}-{i}"
            recorder.add((time.time(), "allocate", rid, 1, 16, [i % 1024], 0.01, None, 1000, None, step, None))
        recorder.end_step()
        (state / "steps.tmp").write_text(str(step))
        os.replace(state / "steps.tmp", state / "steps")  # a SIGTERM mid-write never leaves it empty
        time.sleep(step_s)
    return 0


if __name__ == "__main__":
    mode, state_dir, *numbers = sys.argv[1:]
    if mode == "driver":
        sys.exit(driver([state_dir, *numbers]))
    sys.exit(engine(Path(state_dir), int(numbers[0]), int(numbers[1]), float(numbers[2])))
