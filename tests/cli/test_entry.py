from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest


def test_import_modelopt_loads_no_torch_until_a_name_is_used():
    code = ("import sys, modelopt; a = 'torch' in sys.modules; from modelopt import optimize; import modelopt.api; "
            "print(a, 'torch' in sys.modules, optimize is modelopt.api.optimize, 'RunConfig' in dir(modelopt))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "True", "True"]


def test_an_unknown_name_is_an_attribute_error():
    import modelopt

    with pytest.raises(AttributeError, match="no attribute 'optimise'"):
        modelopt.optimise  # noqa: B018


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
def test_ctrl_c_while_the_cli_starts_is_one_line(tmp_path):
    """Ctrl-C in the first seconds of any verb (torch still importing) ended in an import's KeyboardInterrupt
    traceback."""
    # A shell's foreground job takes Ctrl-C; pytest-xdist's workers ignore SIGINT, and a child inherits that.
    proc = subprocess.Popen([sys.executable, "-m", "modelopt", "optimize", "--out", str(tmp_path / "r")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.5)  # the entry is running, the CLI (torch) is still importing: seconds on any machine
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "modelopt: interrupted while starting; nothing was run or written"
    assert not (tmp_path / "r").exists()
