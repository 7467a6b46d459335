"""A notebook kernel's standard error goes to the chapter's log, not to the command's terminal:
after SIGTERM a stopped kernel prints a ZMQ traceback, which buried the nightly's one-line reason."""

from __future__ import annotations

import pytest

from labsupport.ops import live

pytestmark = pytest.mark.unit


def test_a_kernels_standard_error_goes_to_the_chapter_log(tmp_path, capfd):
    from jupyter_client.manager import start_new_kernel

    log = tmp_path / "chapter.kernel.log"
    with live.kernel_stderr_to(log):
        km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute_interactive("import os; os.write(2, b'written-by-the-kernel\\n')", timeout=60)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert "written-by-the-kernel" in log.read_text()
    assert "written-by-the-kernel" not in capfd.readouterr().err


def test_kernels_started_afterwards_keep_the_commands_standard_error(tmp_path):
    from jupyter_client.provisioning import local_provisioner as lp

    before = lp.launch_kernel
    with live.kernel_stderr_to(tmp_path / "k.log"):
        assert lp.launch_kernel is not before
    assert lp.launch_kernel is before
