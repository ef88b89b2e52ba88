"""benchmarks/profile_workbook.py: py-spy's raw samples of a run put in kinds of work, waiting threads left out."""
import importlib.util
import subprocess
import sys

from conftest import ROOT

SERVER = ("process 9:\"python -B -c from multiprocessing.forkserver import main; main(3, 5, ['torch._dynamo', "
          "'transformers.models.auto.tokenization_auto'])\"")


def _module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("profile_workbook", ROOT / "benchmarks" / "profile_workbook.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_each_sample_is_the_first_kind_its_frames_hold_and_waiting_threads_are_left_out():
    profile = _module()
    kernel = f'process 1:"portkit run";{SERVER};process 12:"kernel";_bootstrap (kernel_forks.py:315)'
    lines = [
        f"{kernel};run (torch/_dynamo/eval_frame.py:10);_AtenRecorder.__torch_dispatch__ "
        "(portkit/targets/backends.py:294) 100",                                   # the retrace inside a trace
        f"{kernel};run (torch/_dynamo/eval_frame.py:10);step (torch/_dynamo/symbolic_convert.py:1556) 150",
        f"{kernel};forward (transformers/models/bert/modeling_bert.py:99) 50",
        f"{kernel};Thread.run (threading.py:982);EpollSelector.select (selectors.py:468) 400",   # waits: no CPU
        f"{kernel};Heartbeat.run (ipykernel/heartbeat.py:124);device (zmq/sugar/__init__.py:21) 400",
        f"{kernel};write_json (portkit/runfolder/atomic_io.py:40) 25",     # PRELOAD's names in the server's command
        "not a sample line",
    ]
    seconds = profile.cpu_by_kind(lines, rate=50)
    assert seconds == {"Dynamo's tracing": 3.0, "the emulated backends' retrace (ATen ops on fake tensors)": 2.0,
                       "eager forwards (torch.nn, transformers' models)": 1.0, profile.REST: 0.5}
    assert list(seconds)[0] == "Dynamo's tracing"     # busiest first
    assert profile.table(seconds).splitlines()[-1] == "| all | 6.5 | |"


def test_a_raw_file_that_is_not_there_is_one_error_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_workbook.py"), "--raw",
                           str(tmp_path / "none.raw")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(f"no such file: {tmp_path}/none.raw")
