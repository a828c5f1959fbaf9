"""bench.step_profile reads perf's report into CPU a request by what runs it."""

import os

from bench.step_profile import FREQUENCY, host_pids, per_request, samples_in, short

REPORT = """\
# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 1K of event 'cpu-clock:pppH'
#
#      Samples  Shared Object
# ............  ..............................................
#
           218  [kernel.kallsyms]
             1  [vdso]
            50  libc.so.6
            23  marshaller.cpython-311-x86_64-linux-gnu.so
           820  python3.11
             2  [kernel.kallsyms]
"""


def test_the_samples_of_each_shared_object_are_added_up_and_comments_left_out() -> None:
    assert samples_in(REPORT) == {
        "[kernel.kallsyms]": 220,
        "[vdso]": 1,
        "libc.so.6": 50,
        "marshaller.cpython-311-x86_64-linux-gnu.so": 23,
        "python3.11": 820,
    }


def test_a_report_with_no_samples_is_empty() -> None:
    assert samples_in("# Samples: 0\n#\n") == {}


def test_a_sample_stands_for_one_period_of_cpu_shared_by_the_requests() -> None:
    # FREQUENCY samples are one second of CPU; over 1,000 requests, 1,000 µs each.
    assert per_request({"python3.11": FREQUENCY}, 1000) == {"python3.11": 1000.0}


def test_libraries_are_shown_by_their_short_names() -> None:
    assert short("message_bus.cpython-311-x86_64-linux-gnu.so") == "message_bus"
    assert short("libc.so.6") == "libc"
    assert short("libsqlite3.so.0.8.6") == "libsqlite3"
    assert short("[kernel.kallsyms]") == "[kernel.kallsyms]"


def test_a_process_outside_any_other_pid_namespace_is_its_own_number() -> None:
    # This test's process, in its own namespace: one NSpid, itself. (Not found by its parent,
    # which may be an init this process cannot look into, as for a run started in the
    # background by a shell that exited.)
    found = host_pids(os.getpid())
    assert found[os.getpid()] == os.getpid()
