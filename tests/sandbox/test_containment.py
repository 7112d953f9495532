"""Each sandbox is confined: no network, only its own files, no root, bounded resources.

Every test runs against a real sandbox on our server (bubblewrap + rlimits), with the
tight limits of the test server: 4 s per call, 2 s of CPU per call, 512 MiB of address
space, 8 MiB files and 32 processes, and 1 MiB of output per text.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from agentscope_serverless.sandbox_protocol import CallToolResult
from agentscope_serverless.services.sandbox import Sandbox, SandboxService
from tests.sandbox.conftest import RunningServer

MAX_OUTPUT = 1024**2


def part(result: dict[str, Any], description: str) -> str:
    return CallToolResult.model_validate(result).part(description) or ""


async def box(service: SandboxService, session_id: str) -> Sandbox:
    [sandbox] = await service.connect_async(session_id)
    return sandbox


async def assert_still_works(sandbox: Sandbox) -> None:
    result = await sandbox.run_shell_command_async("echo ok")
    assert part(result, "stdout") == "ok\n"


async def test_a_sandbox_has_no_network(
    sandbox_service: SandboxService, sandbox_server: RunningServer, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    # The sandbox server listens on the host's loopback; from inside it is unreachable.
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {sandbox_server.port}), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', type(exc).__name__)\n"
    )
    result = await sandbox.run_ipython_cell_async(code)
    assert part(result, "stdout").startswith("refused")
    interfaces = await sandbox.run_shell_command_async("tail -n +3 /proc/net/dev | cut -d: -f1")
    assert part(interfaces, "stdout").split() == ["lo"]


async def test_a_sandbox_cannot_read_another_sandboxs_workspace(
    sandbox_service: SandboxService, sandbox_server: RunningServer, session_id: str
) -> None:
    alice = await box(sandbox_service, f"{session_id}-alice")
    mallory = await box(sandbox_service, f"{session_id}-mallory")
    await alice.write_file_async("secret.txt", "alice's secret")
    host_path = sandbox_server.root / "sandboxes" / alice.sandbox_id / "workspace" / "secret.txt"
    assert host_path.read_text() == "alice's secret"

    attempt = await mallory.run_shell_command_async(
        f"cat {host_path}; cat /workspace/../{alice.sandbox_id}/workspace/secret.txt; "
        "ls -a /workspace/.. /tmp"
    )
    assert "alice's secret" not in part(attempt, "stdout")
    assert part(await mallory.list_directory_async("."), "stdout") == ""


async def test_a_sandbox_sees_no_host_files_beyond_system_directories(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    result = await sandbox.run_shell_command_async(
        "ls /root; ls /home; cat /etc/shadow; ls /work; ls /"
    )
    assert part(result, "stderr").count("No such file or directory") == 4
    assert set(part(result, "stdout").split()) <= {
        "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr",
        "workspace",
    }  # fmt: skip


async def test_a_sandbox_cannot_write_outside_its_workspace(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    code = (
        "results = []\n"
        "for path in ['/usr/evil', '/etc/evil', '/evil', '/bin/evil', '/proc/evil']:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        results.append('wrote ' + path)\n"
        "    except OSError as exc:\n"
        "        results.append(type(exc).__name__)\n"
        "open('/workspace/fine.txt', 'w').write('ok')\n"
        "results\n"
    )
    result = await sandbox.run_ipython_cell_async(code)
    assert "wrote" not in part(result, "stdout")
    assert result["isError"] is False


async def test_a_sandbox_runs_without_root_or_capabilities(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    result = await sandbox.run_shell_command_async("id -u; grep CapEff /proc/self/status")
    uid, caps = part(result, "stdout").splitlines()
    assert uid == "65534"
    assert caps.split()[1] == "0000000000000000"


async def test_a_symlink_cannot_lead_a_file_tool_out_of_the_workspace(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    await sandbox.run_shell_command_async("ln -s /etc/passwd link")
    result = await sandbox.read_file_async("link")
    assert result["isError"] is True
    assert "outside the workspace" in part(result, "stderr")


async def test_a_fork_bomb_is_stopped_by_the_process_limit_without_hurting_others(
    sandbox_service: SandboxService, session_id: str
) -> None:
    bombed = await box(sandbox_service, f"{session_id}-bomb")
    bystander = await box(sandbox_service, f"{session_id}-bystander")
    bomb = (
        "import os, time\n"
        "forked = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        forked += 1\n"
        "except OSError as exc:\n"
        "    print('stopped after', forked, type(exc).__name__)\n"
        "time.sleep(1.5)\n"
    )
    bombing = asyncio.create_task(bombed.run_ipython_cell_async(bomb))
    await asyncio.sleep(0.7)  # the bomb now holds every process it may have
    await assert_still_works(bystander)
    words = part(await bombing, "stdout").split()
    assert words[:2] == ["stopped", "after"]
    assert int(words[2]) < 32
    assert words[3] == "BlockingIOError"

    shell_bomb = await bombed.run_shell_command_async("bomb() { bomb | bomb & }; bomb; sleep 1")
    assert shell_bomb["content"]
    # Nothing outlives a call: only the interpreter (and this command's shell) remain.
    processes = await bombed.run_shell_command_async("ls /proc | grep -c '^[0-9]'")
    assert int(part(processes, "stdout")) <= 5
    await assert_still_works(bombed)


# Makes every other process of the sandbox it may ptrace (same uid) exec a heartbeat
# instead, by setting its registers (x86_64) to an execve at a syscall instruction of its own.
TAKE_OVER = r"""
import ctypes, os, re, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
class Registers(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags "
        "rsp ss fs_base gs_base ds es fs gs").split()]
HEARTBEAT = (
    b"import time\nwhile True:\n"
    b"    open('/workspace/heartbeat', 'a').write('beat\\n')\n    time.sleep(0.05)\n"
)
taken = []
for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        continue
    os.waitpid(pid, 0x40000000)  # __WALL
    registers = Registers()
    libc.ptrace(12, pid, None, ctypes.byref(registers))  # PTRACE_GETREGS
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as memory:
        syscall = None
        for line in open(f"/proc/{pid}/maps"):
            found = re.match(r"([0-9a-f]+)-([0-9a-f]+) r-xp", line)
            if found and syscall is None:
                start, end = int(found[1], 16), int(found[2], 16)
                memory.seek(start)
                offset = memory.read(end - start).find(b"\x0f\x05")
                syscall = start + offset if offset >= 0 else None
        base = (registers.rsp - 8192) & ~0xF
        blob, pointers = b"", []
        for text in (b"/usr/bin/python3\0", b"-c\0", HEARTBEAT + b"\0"):
            pointers.append(base + len(blob))
            blob += text
        argv = (base + len(blob) + 15) & ~0xF
        memory.seek(base)
        memory.write(blob.ljust(argv - base, b"\0") + struct.pack("<4Q", *pointers, 0))
    registers.rax, registers.orig_rax, registers.rip = 59, 2**64 - 1, syscall  # execve
    registers.rdi, registers.rsi, registers.rdx = pointers[0], argv, 0
    libc.ptrace(13, pid, None, ctypes.byref(registers))  # PTRACE_SETREGS
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    taken.append(pid)
print(taken)
"""


async def test_no_process_taken_over_with_ptrace_outlives_its_call(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    taken = await sandbox.run_ipython_cell_async(TAKE_OVER)
    assert part(taken, "stdout") == "[]\n", part(taken, "stderr")
    later = await sandbox.run_ipython_cell_async(
        "import os, time\n"
        "beats = lambda: os.path.exists('heartbeat') and len(open('heartbeat').readlines())\n"
        "before = beats()\n"
        "time.sleep(0.5)\n"
        "beats() != before"
    )
    assert part(later, "stdout") == "False\n"


async def test_orphans_are_reaped_as_they_exit_during_a_call(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    # Each ( ... &) leaves an orphan: 100 of them, past the 32 processes a sandbox may have.
    result = await sandbox.run_shell_command_async(
        "for i in $(seq 100); do (true &); sleep 0.01; done; echo done"
    )
    assert part(result, "stdout") == "done\n"
    assert part(result, "stderr") == ""


async def test_a_memory_hog_is_stopped_by_the_memory_limit(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    await sandbox.run_ipython_cell_async("kept = 'yes'")
    hog = await sandbox.run_ipython_cell_async(
        "hog = []\nwhile True:\n    hog.append(bytearray(10 * 1024**2))"
    )
    assert hog["isError"] is True
    assert "MemoryError" in part(hog, "stderr")
    after = await sandbox.run_ipython_cell_async("del hog\nkept")
    assert part(after, "stdout") == "'yes'\n"
    shell_hog = await sandbox.run_shell_command_async("python3 -c 'x = bytearray(2 * 1024**3)'")
    assert "MemoryError" in part(shell_hog, "stderr")


async def test_an_endless_python_loop_is_stopped_and_the_state_kept(
    sandbox_service: SandboxService, session_id: str
) -> None:
    looping = await box(sandbox_service, f"{session_id}-loop")
    other = await box(sandbox_service, f"{session_id}-other")
    await looping.run_ipython_cell_async("before = 1")
    started = time.perf_counter()
    loop_task = asyncio.create_task(looping.run_ipython_cell_async("while True:\n    pass"))
    await asyncio.sleep(0.3)
    quick_started = time.perf_counter()
    await assert_still_works(other)
    assert time.perf_counter() - quick_started < 1.5
    result = await loop_task
    assert time.perf_counter() - started < 4.5
    assert "TimeoutError" in part(result, "stderr")
    assert part(await looping.run_ipython_cell_async("before"), "stdout") == "1\n"


async def test_each_cell_gets_its_whole_cpu_budget_whatever_the_interpreter_used_before(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    # The interpreter has used x.9 s of CPU: rounded down, the next cell's 2 s were 1.1 s.
    spent = await sandbox.run_ipython_cell_async(
        "import time\nwhile time.process_time() % 1 < 0.9: pass\nprint('spent')"
    )
    assert part(spent, "stdout") == "spent\n"
    burn = await sandbox.run_ipython_cell_async(
        "start = time.process_time()\nwhile time.process_time() - start < 1.3: pass\nprint('done')"
    )
    assert part(burn, "stdout") == "done\n", part(burn, "stderr")


async def test_a_sleeping_cell_is_stopped_by_the_wall_clock(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    started = time.perf_counter()
    result = await sandbox.run_ipython_cell_async("import time\ntime.sleep(60)")
    assert 3.5 < time.perf_counter() - started < 6
    assert "wall-clock time limit" in part(result, "stderr")


async def test_a_cell_stuck_in_native_code_is_killed_and_the_sandbox_recovers(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    started = time.perf_counter()
    result = await sandbox.run_ipython_cell_async("sum(range(10**13))")
    assert time.perf_counter() - started < 9
    assert result["isError"] is True
    assert "time limit" in part(result, "stderr")
    assert part(await sandbox.run_ipython_cell_async("1 + 1"), "stdout") == "2\n"


async def test_an_endless_shell_command_is_stopped_by_its_limits(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    busy, idle = await asyncio.gather(
        sandbox.run_shell_command_async("python3 -c 'while True: pass'"),
        (await box(sandbox_service, f"{session_id}-idle")).run_shell_command_async("sleep 60"),
    )
    assert part(busy, "returncode") == "137"  # killed by the CPU limit
    assert part(idle, "returncode") == "-9"  # killed by the wall clock
    assert "time limit" in part(idle, "stderr")


async def test_the_file_size_limit_bounds_a_file(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    result = await sandbox.run_shell_command_async(
        "head -c 20000000 /dev/zero > big; stat -c %s big"
    )
    assert part(result, "stdout") == f"{8 * 1024**2}\n"
    assert "File size limit exceeded" in part(result, "stderr")


async def test_a_cell_holding_every_file_descriptor_reports_and_the_next_frees_them(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    await sandbox.run_ipython_cell_async("kept = 'yes'")
    leak = (
        "files = []\n"
        "try:\n"
        "    while True:\n"
        "        files.append(open('/dev/null'))\n"
        "except OSError as exc:\n"
        "    print('stopped after', len(files), exc.strerror)\n"
    )
    leaked = await sandbox.run_ipython_cell_async(leak)
    assert part(leaked, "stdout").startswith("stopped after 2")
    assert part(leaked, "stdout").endswith("Too many open files\n")
    refused = await sandbox.run_shell_command_async("echo ok")
    assert "Too many open files" in part(refused, "stderr")
    freed = await sandbox.run_ipython_cell_async("for f in files:\n    f.close()\nkept")
    assert part(freed, "stdout") == "'yes'\n"
    await assert_still_works(sandbox)


async def test_a_cell_replacing_the_output_capture_loses_its_interpreter_not_a_file(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    await sandbox.run_shell_command_async("echo precious > victim")
    replacing = (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    link = f'/proc/self/fd/{fd}'\n"
        "    if os.path.exists(link) and os.readlink(link).startswith('/memfd:'):\n"
        "        os.close(fd)\n"
        "        os.open('/workspace/victim', os.O_RDWR)\n"
    )
    lost = await sandbox.run_ipython_cell_async(replacing)
    assert lost["isError"] is True
    assert "interpreter state" in part(lost, "stderr")
    assert part(await sandbox.run_shell_command_async("cat victim"), "stdout") == "precious\n"
    assert part(await sandbox.run_ipython_cell_async("print('fresh')"), "stdout") == "fresh\n"


async def test_a_sandbox_cannot_make_user_namespaces(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    # In a user namespace of its own, a process holds every capability over what it mounts.
    result = await sandbox.run_shell_command_async(
        "unshare -rm sh -c 'mount -t tmpfs x /tmp && echo mounted'; echo status $?; "
        "unshare -U true; echo status $?"
    )
    assert "mounted" not in part(result, "stdout")
    assert part(result, "stdout").split() == ["status", "1", "status", "1"]
    await assert_still_works(sandbox)


# Each call with arguments an unprivileged process may give it, so that nothing but the
# system call filter refuses it: keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1),
# io_uring_setup(1, params), userfaultfd(UFFD_USER_MODE_ONLY), ptrace(PTRACE_TRACEME).
FILTERED_CALLS = (
    ("keyctl", "0, -3, 1"),
    ("io_uring_setup", "1, ctypes.byref(ctypes.create_string_buffer(120))"),
    ("userfaultfd", "1"),
    ("ptrace", "0, 0, 0, 0"),
)


async def test_a_sandbox_cannot_make_the_system_calls_it_never_needs(
    sandbox_service: SandboxService, session_id: str
) -> None:
    import pyseccomp

    sandbox = await box(sandbox_service, session_id)
    arch = pyseccomp.system_arch()
    calls = "".join(
        f"call({name!r}, {pyseccomp.resolve_syscall(arch, name)}, {arguments})\n"
        for name, arguments in FILTERED_CALLS
    )
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(name, number, *arguments):\n"
        "    done = libc.syscall(number, *arguments)\n"
        "    print(name, 'refused' if done == -1 else 'made', os.strerror(ctypes.get_errno()))\n"
        + calls
    )
    result = await sandbox.run_ipython_cell_async(code)
    assert part(result, "stdout").splitlines() == [
        f"{name} refused Operation not permitted" for name, _ in FILTERED_CALLS
    ]
    await assert_still_works(sandbox)


# Writes, on the agent's reply pipe, a reply to the call the cell runs in, whose parts are
# the JSON that PARTS makes (``part(text)`` is one), then waits for the server to take it.
FORGING_CELL = """
import json, os, sys, time
frame = sys._getframe()
while frame.f_code.co_name != "serve":
    frame = frame.f_back
agent, request = frame.f_locals["self"], frame.f_locals["request"]

def part(text):
    return json.dumps({"type": "text", "description": "stdout", "text": text}).encode()

parts = PARTS
data = b'{"id": %d, "result": {"isError": false, "content": [%s]}}\\n' % (request["id"], parts)
while data:
    data = data[os.write(agent.replies, data):]
time.sleep(3)
"""


def forging_cell(parts: str) -> str:
    return FORGING_CELL.replace("PARTS", parts)


async def test_a_reply_forged_past_the_longest_the_agent_sends_is_refused_without_a_stall(
    sandbox_service: SandboxService, sandbox_server: RunningServer, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    # 54 MB of empty parts: slow to parse and large in memory, were it read.
    cell = forging_cell("b','.join([part('')] * 1_000_000)")
    latencies: list[float] = []

    async def probe_health(http: httpx.AsyncClient) -> None:
        while True:
            started = time.monotonic()
            await http.get(f"{sandbox_server.url}/health")
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(timeout=60) as http:
        probing = asyncio.create_task(probe_health(http))
        started = time.monotonic()
        result = await sandbox.run_ipython_cell_async(cell)
        took = time.monotonic() - started
        probing.cancel()
    assert result["isError"] is True
    assert "sent a reply longer than" in part(result, "stderr")
    assert took < 3.0
    assert max(latencies) < 0.5
    await assert_still_works(sandbox)


@pytest.mark.parametrize("count", [4, 100_000])
async def test_a_forged_reply_with_more_parts_than_the_agent_sends_is_refused(
    sandbox_service: SandboxService, session_id: str, count: int
) -> None:
    sandbox = await box(sandbox_service, session_id)
    result = await sandbox.run_ipython_cell_async(forging_cell(f"b','.join([part('x')] * {count})"))
    assert result["isError"] is True
    assert "malformed reply" in part(result, "stderr")
    await assert_still_works(sandbox)


async def test_a_forged_reply_gets_no_more_output_through_than_the_output_limit(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    result = await sandbox.run_ipython_cell_async(forging_cell("part('x' * 5_000_000)"))
    stdout = part(result, "stdout")
    assert stdout.startswith("x" * MAX_OUTPUT)
    assert stdout[MAX_OUTPUT:] == "\n[output truncated: 5000000 characters in total]\n"


@pytest.mark.parametrize("description", ["x" * 5_000_000, "stdout\u001b]0;owned\u0007"])
async def test_a_forged_reply_gets_nothing_through_its_descriptions(
    sandbox_service: SandboxService, session_id: str, description: str
) -> None:
    # A part's description is a label the agent picks (stdout, stderr, returncode): a text
    # of the sandbox's choosing there would be output past the output limit.
    sandbox = await box(sandbox_service, session_id)
    labelled = f"json.dumps({{'type': 'text', 'description': {description!r}, 'text': 'x'}})"
    result = await sandbox.run_ipython_cell_async(forging_cell(f"{labelled}.encode()"))
    assert result["isError"] is True
    assert "malformed reply" in part(result, "stderr")
    assert {p["description"] for p in result["content"]} <= {"stdout", "stderr"}
    await assert_still_works(sandbox)


async def test_the_largest_output_of_a_call_comes_back_and_keeps_the_interpreter(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    await sandbox.run_ipython_cell_async("kept = 'yes'")
    # Every byte JSON's longest: NUL is sent as \u0000, and the agent escapes { as \u007b.
    result = await sandbox.run_shell_command_async(
        "head -c 2000000 /dev/zero; head -c 2000000 /dev/zero | tr '\\0' '{' >&2"
    )
    note = "\n[output truncated: 2000000 bytes in total]\n"
    assert part(result, "stdout") == "\0" * MAX_OUTPUT + note
    assert part(result, "stderr") == "{" * MAX_OUTPUT + note
    kept = await sandbox.run_ipython_cell_async("kept")
    assert part(kept, "stdout") == "'yes'\n"


async def test_a_command_printing_past_the_file_size_limit_runs_to_its_end_its_output_cut(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    # 20 MB on one line, more than the 8 MiB a file may hold.
    result = await sandbox.run_shell_command_async(
        "head -c 20000000 /dev/zero | tr '\\0' x; echo end >&2"
    )
    assert (
        part(result, "stdout")
        == "x" * MAX_OUTPUT + "\n[output truncated: 20000000 bytes in total]\n"
    )
    assert part(result, "stderr") == "end\n"
    assert part(result, "returncode") == "0"


async def test_a_cell_printing_past_the_file_size_limit_runs_on_its_output_cut(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    # 20 MB in one print, then as many in small ones: more than the 8 MiB a file may hold.
    result = await sandbox.run_ipython_cell_async(
        "import subprocess, sys\n"
        "print('x' * 20_000_000, end='')\n"
        "for _ in range(20_000):\n"
        "    sys.stdout.write('y' * 1000)\n"
        "_ = subprocess.run(['echo', 'end'], stdout=sys.stderr)"
    )
    note = "\n[output truncated: 40000000 bytes in total]\n"
    assert part(result, "stdout") == "x" * MAX_OUTPUT + note
    assert part(result, "stderr") == "end\n"
    assert result["isError"] is False


async def test_a_command_leaving_a_process_that_writes_on_returns_when_it_exits(
    sandbox_service: SandboxService, session_id: str
) -> None:
    sandbox = await box(sandbox_service, session_id)
    started = time.perf_counter()
    result = await sandbox.run_shell_command_async("echo started; (yes &)")
    assert time.perf_counter() - started < 3
    assert part(result, "stdout").startswith("started\n")
    assert part(result, "returncode") == "0"
    await assert_still_works(sandbox)


# After its reply, the agent stops reading requests: sandbox code can make it (its cells run
# in the agent's interpreter).
DEAF_AGENT_CELL = """
import sys, time
Agent = sys.modules["__main__"].Agent
send = Agent.send
def deaf_send(self, message):
    send(self, message)
    if "id" in message:
        time.sleep(10**6)
Agent.send = deaf_send
"""


async def test_a_request_the_agent_does_not_read_is_stopped_by_the_call_time_limit(
    sandbox_server: RunningServer, session_id: str
) -> None:
    # The client waits far longer than the server's 4 s per call: the server must answer.
    async with SandboxService(sandbox_server.url, sandbox_server.token, timeout=30) as service:
        sandbox = await box(service, session_id)
        await sandbox.run_ipython_cell_async("kept = 'no'")
        await sandbox.run_ipython_cell_async(DEAF_AGENT_CELL)
        # Larger than a pipe's buffer: the server cannot hand it over unless the agent reads.
        result = await sandbox.write_file_async("big.txt", "x" * 1_000_000)
        assert result["isError"] is True
        assert "ran past its time limit of 4 s" in part(result, "stderr")
        lost = await sandbox.run_ipython_cell_async("kept")
        assert "NameError" in part(lost, "stderr")
        await assert_still_works(sandbox)
        await service.release_async(session_id)


async def test_a_thread_printing_on_between_cells_keeps_the_interpreter(
    sandbox_service: SandboxService, session_id: str
) -> None:
    # Each call pointed sys.stdout at a new stream and dropped the last: a thread printing
    # at that moment wrote on a stream freed under it (Python's print holds no reference),
    # and the interpreter died of a segmentation fault or sent a garbled reply, its
    # variables lost.
    sandbox = await box(sandbox_service, session_id)
    started = await sandbox.run_ipython_cell_async(
        "import sys, threading, time\n"
        "kept = 42\n"
        "def chatter():\n"
        "    while True:\n"
        "        print('y' * 1000)\n"
        "threading.Thread(target=chatter, daemon=True).start()\n"
        "time.sleep(0.3)"
    )
    assert part(started, "stderr") == ""
    for _ in range(5):
        result = await sandbox.run_ipython_cell_async(
            "time.sleep(0.1)\nprint('kept', kept, file=sys.stderr)"
        )
        assert part(result, "stderr") == "kept 42\n"  # the thread's output fills stdout
