"""A stage that reads another late (layout.Stage.reads_late) waits in its cell while that stage runs in the same
`portkit run`: while its marker is in the run folder and the run that wrote it lives."""
import os
import subprocess
import sys
import threading

from portkit.runfolder import layout, results


def test_it_waits_while_the_marker_is_there_and_its_run_lives(tmp_path):
    marker = tmp_path / layout.running_marker("fallbacks")
    marker.write_text(str(os.getpid()))                       # this process: a run that lives
    threading.Timer(0.6, marker.unlink).start()               # the stage ends: the run removes its marker
    assert results.wait_while_running(tmp_path, "fallbacks", poll=0.05) >= 0.5
    assert not marker.exists()


def test_it_does_not_wait_without_a_live_run(tmp_path):
    assert results.wait_while_running(tmp_path, "fallbacks") < 0.1           # no marker: a notebook on its own
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    marker = tmp_path / layout.running_marker("fallbacks")
    marker.write_text(ended.stdout.strip())                   # a run that was killed left its marker
    assert results.wait_while_running(tmp_path, "fallbacks") < 0.1
    marker.write_text("not a process id")
    assert results.wait_while_running(tmp_path, "fallbacks") < 0.1


def test_only_stage_2_reads_a_stage_late_and_it_reads_it_at_all():
    late = {s.name: s.reads_late for s in layout.STAGES if s.reads_late}
    assert late == {"compile": ("fallbacks",)}
    assert all(set(s.reads_late) <= set(s.reads) for s in layout.STAGES)
