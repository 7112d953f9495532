"""SandboxService against our sandbox server over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentscope_serverless.errors import (
    InvalidInputError,
    SandboxAuthenticationError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxUnavailableError,
    ServiceNotStartedError,
)
from agentscope_serverless.sandbox_protocol import CallToolResult
from agentscope_serverless.services.base import ServiceWithLifecycleManager
from agentscope_serverless.services.sandbox import Sandbox, SandboxClient, SandboxService
from agentscope_serverless.services.sandbox.service import session_ctx_id
from agentscope_serverless.services.sandbox.tools import read_file, run_ipython_cell
from agentscope_serverless.settings import load_settings
from tests.sandbox.conftest import RunningServer


def part(result: dict[str, Any], description: str) -> str | None:
    return CallToolResult.model_validate(result).part(description)


async def test_connect_runs_python_with_state_shell_and_files_then_release(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id, "u1")
    assert box.sandbox_type == "base"

    first = await box.run_ipython_cell_async("counter = 41\nprint('set')")
    second = await box.run_ipython_cell_async("counter + 1")
    assert first == {
        "meta": None,
        "content": [{"type": "text", "text": "set\n", "description": "stdout"}],
        "structuredContent": None,
        "isError": False,
    }
    assert part(second, "stdout") == "42\n"

    shell = await box.run_shell_command_async("echo out; echo err >&2; exit 3")
    assert part(shell, "stdout") == "out\n"
    assert part(shell, "stderr") == "err\n"
    assert part(shell, "returncode") == "3"
    assert shell["isError"] is True

    await box.write_file_async("notes/today.txt", "hello sandbox")
    assert part(await box.read_file_async("notes/today.txt"), "stdout") == "hello sandbox"
    assert part(await box.list_directory_async("notes"), "stdout") == "[FILE] today.txt"
    cat = await box.run_shell_command_async("cat notes/today.txt")
    assert part(cat, "stdout") == "hello sandbox"

    assert await sandbox_service.release_async(session_id, "u1") is True
    with pytest.raises(SandboxNotFoundError):
        await box.run_ipython_cell_async("counter")


async def test_a_python_exception_is_an_error_result_not_a_raise(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    result = await box.run_ipython_cell_async("1 / 0")
    assert result["isError"] is True
    assert "ZeroDivisionError" in (part(result, "stderr") or "")


async def test_a_new_service_object_reaches_the_same_sandbox(
    sandbox_server: RunningServer, session_id: str
) -> None:
    async with SandboxService(sandbox_server.url, sandbox_server.token) as first:
        [box] = await first.connect_async(session_id, "u1", env_types=["base"])
        await box.run_ipython_cell_async("secret = 'kept'")
        async with SandboxService(sandbox_server.url, sandbox_server.token) as second:
            [again] = await second.connect_async(session_id, "u1", env_types=["base"])
            assert again.sandbox_id == box.sandbox_id
            assert part(await again.run_ipython_cell_async("secret"), "stdout") == "'kept'\n"
        await first.release_async(session_id, "u1")


async def test_clients_connecting_one_session_at_once_share_its_sandboxes(
    sandbox_server: RunningServer, session_id: str
) -> None:
    # Two Lambda instances (two service objects) connect the same session at the same time:
    # neither finds a sandbox, each makes one; both must go on with the same.
    services = [SandboxService(sandbox_server.url, sandbox_server.token) for _ in range(3)]
    for service in services:
        await service.start()
    try:
        connected = await asyncio.gather(
            *(s.connect_async(session_id, "u1", env_types=["base", "filesystem"]) for s in services)
        )
        ids = {tuple(box.sandbox_id for box in boxes) for boxes in connected}
        assert len(ids) == 1
        # The others made were released: the session maps only those in use.
        listed = await services[0].sandboxes_async(session_id, "u1")
        assert sorted(box.sandbox_id for box in listed) == sorted(ids.pop())
        [(base, _), (other_base, _), _] = connected
        await base.run_ipython_cell_async("shared = 'yes'")
        assert part(await other_base.run_ipython_cell_async("shared"), "stdout") == "'yes'\n"
    finally:
        await services[0].release_async(session_id, "u1")
        for service in services:
            await service.stop()


async def test_connecting_one_session_at_once_past_the_users_share_shares_its_sandbox(
    sandbox_server: RunningServer, session_id: str
) -> None:
    # Each connect that found no sandbox made one: those past the user's share got a 429
    # (the share held by the others' copies) where the session's sandbox was there to use.
    services = [
        SandboxService(sandbox_server.url, sandbox_server.token, max_sandboxes_per_user=2)
        for _ in range(6)
    ]
    for service in services:
        await service.start()
    try:
        connected = await asyncio.gather(
            *(s.connect_async(session_id, "u-share", env_types=["base"]) for s in services)
        )
        assert len({box.sandbox_id for [box] in connected}) == 1
        listed = await services[0].sandboxes_async(session_id, "u-share")
        assert [box.sandbox_id for box in listed] == [connected[0][0].sandbox_id]
    finally:
        await services[0].release_async(session_id, "u-share")
        for service in services:
            await service.stop()


async def test_the_user_is_part_of_the_session_key(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [alice] = await sandbox_service.connect_async(session_id, "alice")
    [bob] = await sandbox_service.connect_async(session_id, "bob")
    [anonymous] = await sandbox_service.connect_async(session_id)
    assert len({alice.sandbox_id, bob.sandbox_id, anonymous.sandbox_id}) == 3
    mapping = sandbox_service.client.get_session_mapping
    assert await mapping(f"{session_id}_alice") == [alice.sandbox_id]
    assert await mapping(session_id) == [anonymous.sandbox_id]


async def test_a_wrong_token_raises_an_authentication_error(
    sandbox_server: RunningServer, session_id: str
) -> None:
    async with SandboxService(sandbox_server.url, "not-the-token") as service:
        with pytest.raises(SandboxAuthenticationError) as caught:
            await service.connect_async(session_id)
    assert "not-the-token" not in str(caught.value)
    assert "401" in str(caught.value)


async def test_an_unknown_sandbox_id_raises_not_found(sandbox_service: SandboxService) -> None:
    box = Sandbox(sandbox_service.client, "sbx-does-not-exist", "base")
    with pytest.raises(SandboxNotFoundError):
        await box.run_ipython_cell_async("1")
    with pytest.raises(SandboxNotFoundError):
        await box.get_info_async()


async def test_sync_connect_works_inside_a_running_event_loop(
    sandbox_service: SandboxService, session_id: str
) -> None:
    asyncio.get_running_loop()  # this test body runs inside the loop, like a notebook cell
    [box] = sandbox_service.connect(session_id, "u1")
    box.run_ipython_cell("x = 2")
    assert part(box.run_ipython_cell("x ** 10"), "stdout") == "1024\n"
    assert part(box.run_shell_command("echo hi"), "stdout") == "hi\n"
    [again] = sandbox_service.connect(session_id, "u1")
    assert again.sandbox_id == box.sandbox_id
    assert sandbox_service.release(session_id, "u1") is True


def test_sync_api_works_without_an_event_loop(
    sandbox_server: RunningServer, session_id: str
) -> None:
    service = SandboxService(sandbox_server.url, sandbox_server.token)
    asyncio.run(service.start())
    try:
        [box] = service.connect(session_id, sandbox_types=["base"])
        assert part(box.run_ipython_cell("6 * 7"), "stdout") == "42\n"
        assert service.release(session_id) is True
    finally:
        asyncio.run(service.stop())


async def test_stop_releases_only_the_sandboxes_this_service_created(
    sandbox_server: RunningServer, session_id: str
) -> None:
    async with SandboxService(sandbox_server.url, sandbox_server.token) as other:
        [theirs] = await other.connect_async(f"{session_id}-theirs")
        mine_service = SandboxService(sandbox_server.url, sandbox_server.token)
        await mine_service.start()
        [mine] = await mine_service.connect_async(session_id)
        [reused] = await mine_service.connect_async(f"{session_id}-theirs")
        assert reused.sandbox_id == theirs.sandbox_id
        await mine_service.stop()

        with pytest.raises(SandboxNotFoundError):
            await other.client.get_info(mine.sandbox_id)
        assert part(await theirs.run_ipython_cell_async("'alive'"), "stdout") == "'alive'\n"


def test_the_service_can_be_configured_by_settings() -> None:
    settings = load_settings(
        sandbox_base_url="http://sandbox:8000",
        sandbox_bearer_token="from-the-environment",
        sandbox_timeout_seconds=12,
    )
    service = SandboxService.from_settings(settings)
    assert service.base_url == "http://sandbox:8000"
    assert "from-the-environment" not in repr(service)
    assert SandboxService.from_settings(load_settings()).base_url is None


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"base_url": 8000}, "base_url must be a string or None, not int"),
        ({"base_url": b"http://sandbox"}, "base_url must be a string or None, not bytes"),
        ({"bearer_token": 123}, "bearer_token must be a string or None, not int"),
    ],
)
def test_a_url_or_token_that_is_no_text_is_refused_when_the_service_is_made(
    arguments: dict[str, Any], said: str
) -> None:
    # SandboxService(base_url=123) was made, then failed at start with an AttributeError.
    with pytest.raises(TypeError, match=said):
        SandboxService(**arguments)


async def test_health_pings_the_server(sandbox_server: RunningServer) -> None:
    service = SandboxService(sandbox_server.url, sandbox_server.token)
    assert await service.health() is False  # not started
    async with service:
        assert await service.health() is True
    async with SandboxService("http://127.0.0.1:9", "token") as unreachable:
        assert await unreachable.health() is False


async def test_health_is_false_when_the_server_refuses_the_token(
    sandbox_server: RunningServer,
) -> None:
    async with SandboxService(sandbox_server.url, "not-the-token") as refused:
        assert await refused.health() is False


async def test_using_the_service_before_start_raises_not_started() -> None:
    service = SandboxService("http://127.0.0.1:9", "token")
    assert isinstance(service, ServiceWithLifecycleManager)
    with pytest.raises(ServiceNotStartedError):
        service.connect("s1")
    with pytest.raises(ServiceNotStartedError):
        await service.release_async("s1")


async def test_sandbox_types_are_inferred_from_tools(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [files] = await sandbox_service.connect_async(session_id, tools=[read_file])
    assert files.sandbox_type == "filesystem"
    await files.write_file_async("a.txt", "only files here")
    assert part(await files.read_file_async("a.txt"), "stdout") == "only files here"
    # As in AgentScope, a filesystem sandbox runs the generic tools too.
    assert part(await files.run_ipython_cell_async("6 * 7"), "stdout") == "42\n"
    with pytest.raises(SandboxRequestError, match="no tool 'browser_navigate'"):
        await files.call_tool_async("browser_navigate", {"url": "https://example.com"})

    boxes = await sandbox_service.connect_async(session_id, tools=[run_ipython_cell, read_file])
    assert [b.sandbox_type for b in boxes] == ["base", "filesystem"]
    assert boxes[1].sandbox_id == files.sandbox_id


async def test_env_types_and_sandbox_types_are_synonyms(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [a] = await sandbox_service.connect_async(session_id, env_types=["filesystem"])
    [b] = await sandbox_service.connect_async(session_id, sandbox_types=["filesystem"])
    assert a.sandbox_id == b.sandbox_id
    with pytest.raises(InvalidInputError):
        await sandbox_service.connect_async(session_id, env_types=["base"], sandbox_types=["x"])


async def test_a_type_given_as_none_is_skipped(
    sandbox_service: SandboxService, session_id: str
) -> None:
    # AgentScope skipped None in the list, as a list built with conditions holds them.
    boxes = await sandbox_service.connect_async(session_id, sandbox_types=[None, "filesystem"])
    assert [b.sandbox_type for b in boxes] == ["filesystem"]


async def test_an_async_type_name_connects_the_same_sandbox_again(
    sandbox_service: SandboxService, session_id: str
) -> None:
    # AgentScope's async classes ask for base_async: the same sandbox as base.
    [first] = await sandbox_service.connect_async(session_id, "u1", env_types=["base_async"])
    await first.run_ipython_cell_async("kept = 'yes'")
    [again] = await sandbox_service.connect_async(session_id, "u1", env_types=["base_async"])
    [plain] = await sandbox_service.connect_async(session_id, "u1", env_types=["base"])
    assert again.sandbox_id == plain.sandbox_id == first.sandbox_id
    assert again.sandbox_type == first.sandbox_type == "base"
    assert part(await again.run_ipython_cell_async("kept"), "stdout") == "'yes'\n"
    listed = await sandbox_service.sandboxes_async(session_id, "u1")
    assert [box.sandbox_id for box in listed] == [first.sandbox_id]
    await sandbox_service.release_async(session_id, "u1")


async def test_connected_sandboxes_are_instances_of_agentscopes_classes_of_their_type(
    sandbox_service: SandboxService, session_id: str
) -> None:
    from agentscope_serverless import sandbox

    # As AgentScope's service returns instances of the classes registered for the types.
    base, files = await sandbox_service.connect_async(
        session_id, "u1", env_types=["base", "filesystem"]
    )
    assert isinstance(base, sandbox.BaseSandbox) and isinstance(base, sandbox.Sandbox)
    assert not isinstance(base, sandbox.FilesystemSandbox)
    assert isinstance(files, sandbox.FilesystemSandbox) and isinstance(files, sandbox.BaseSandbox)
    assert not isinstance(files, sandbox.FilesystemSandboxAsync)
    assert not isinstance(object(), sandbox.BaseSandbox)
    # Found again (connected by another call), they are the same.
    listed = await sandbox_service.sandboxes_async(session_id, "u1")
    assert [isinstance(box, sandbox.FilesystemSandbox) for box in listed] == [False, True]
    # And they have every method of those classes.
    for box, cls in ((base, sandbox.BaseSandbox), (files, sandbox.FilesystemSandbox)):
        missing = [n for n in dir(cls) if not n.startswith("_") and not hasattr(box, n)]
        assert not missing, (cls.__name__, missing)
    await sandbox_service.release_async(session_id, "u1")


async def test_an_unsupported_sandbox_type_is_a_request_error(
    sandbox_service: SandboxService, session_id: str
) -> None:
    with pytest.raises(SandboxRequestError, match="unsupported sandbox type 'browser'"):
        await sandbox_service.connect_async(session_id, env_types=["browser"])


async def test_release_without_sandboxes_returns_false(
    sandbox_service: SandboxService, session_id: str
) -> None:
    assert await sandbox_service.release_async(session_id, "nobody") is False


async def test_a_blank_session_id_is_invalid(sandbox_service: SandboxService) -> None:
    with pytest.raises(InvalidInputError):
        await sandbox_service.connect_async("   ")


async def test_a_crashed_interpreter_restarts_and_the_mapping_stays(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    await box.run_ipython_cell_async("before = 1")
    await box.write_file_async("kept.txt", "still here")
    crashed = await box.run_ipython_cell_async("import os\nos._exit(7)")
    assert crashed["isError"] is True
    assert "state" in (part(crashed, "stderr") or "")

    after = await box.run_ipython_cell_async("'before' in globals()")
    assert part(after, "stdout") == "False\n"
    assert part(await box.read_file_async("kept.txt"), "stdout") == "still here"
    [again] = await sandbox_service.connect_async(session_id)
    assert again.sandbox_id == box.sandbox_id


async def test_tools_report_bad_arguments_and_paths_as_request_errors(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    with pytest.raises(SandboxRequestError, match="leaves the workspace"):
        await box.read_file_async("../secret")
    with pytest.raises(SandboxRequestError, match="outside the workspace"):
        await box.write_file_async("/etc/evil", "x")
    with pytest.raises(SandboxRequestError, match="bad arguments"):
        await box.call_tool_async("run_shell_command", {"cmd": "ls"})
    absolute = await box.write_file_async("/workspace/ok.txt", "inside")
    assert absolute["isError"] is False


async def test_arguments_holding_a_lone_surrogate_reach_the_sandbox_and_nan_is_refused(
    sandbox_service: SandboxService, session_id: str
) -> None:
    # Half an emoji, as a model may write it ("\\ud83d" in its JSON): JSON, not UTF-8.
    [box] = await sandbox_service.connect_async(session_id)
    cell = await box.run_ipython_cell_async("print('\ud83d')")
    assert cell["isError"] is True
    assert "surrogates not allowed" in (part(cell, "stderr") or "")
    with pytest.raises(SandboxRequestError, match="path"):
        await box.write_file_async("half\ud83d.txt", "x")
    written = await box.write_file_async("half.txt", "\ud83d")
    assert written["isError"] is True
    with pytest.raises(SandboxRequestError, match="NaN"):
        await box.call_tool_async("run_ipython_cell", {"code": "1", "note": float("nan")})
    ok = await box.run_ipython_cell_async("print('ok')")
    assert part(ok, "stdout") == "ok\n"


async def test_list_tools_describes_the_sandbox_tools(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    tools = await box.list_tools_async()
    assert list(tools) == ["generic", "filesystem"]
    assert list(tools["generic"]) == ["run_ipython_cell", "run_shell_command"]
    assert "edit_file" in tools["filesystem"]
    generic = await box.list_tools_async("generic")
    assert list(generic) == ["generic"]
    cell = generic["generic"]["run_ipython_cell"]
    assert cell["name"] == "run_ipython_cell"
    assert cell["json_schema"]["type"] == "function"
    assert cell["json_schema"]["function"]["parameters"]["required"] == ["code"]
    assert await box.list_tools_async("browser") == {"browser": {}}


async def test_a_tool_definition_runs_on_the_connected_sandboxes(
    sandbox_service: SandboxService, session_id: str
) -> None:
    boxes = await sandbox_service.connect_async(session_id, env_types=["base"])
    text = await run_ipython_cell.execute_async(boxes, '{"code": "print(3 * 14)"}')
    assert text == "42\n"
    failed = await run_ipython_cell.execute_async(boxes, {"code": "raise ValueError('no')"})
    assert "[stderr]" in failed and "ValueError: no" in failed


async def test_connect_returns_quickly(sandbox_service: SandboxService, session_id: str) -> None:
    started = time.perf_counter()
    await sandbox_service.connect_async(session_id)
    assert time.perf_counter() - started < 2.0


async def test_release_stops_a_running_call_at_once(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    running = asyncio.create_task(box.run_ipython_cell_async("import time\ntime.sleep(30)"))
    await asyncio.sleep(0.5)
    started = time.perf_counter()
    assert await sandbox_service.release_async(session_id) is True
    assert time.perf_counter() - started < 1.5
    stopped = await running
    assert stopped["isError"] is True
    assert "released" in (part(stopped, "stderr") or "")
    assert "next call" not in (part(stopped, "stderr") or "")


async def test_ids_with_underscores_never_share_a_session_key(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [first] = await sandbox_service.connect_async(f"{session_id}_b", "c")
    [second] = await sandbox_service.connect_async(session_id, "b_c")
    [third] = await sandbox_service.connect_async(f"{session_id}_b_c")
    assert len({first.sandbox_id, second.sandbox_id, third.sandbox_id}) == 3
    await first.run_ipython_cell_async("owner = 'first'")
    result = await second.run_ipython_cell_async("print(globals().get('owner'))")
    assert part(result, "stdout") == "None\n"
    for session, user in (
        (f"{session_id}_b", "c"),
        (session_id, "b_c"),
        (f"{session_id}_b_c", None),
    ):
        assert await sandbox_service.release_async(session, user) is True


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("a_b", "c"), ("a", "b_c")),
        (("a%5Fb", "c"), ("a_b", "c")),
        (("a_b", None), ("a", "b")),
        (("a%", "b"), ("a", "%b")),
        (("x" * 600, "y" * 600), ("x" * 600 + "_" + "y" * 599, "y")),
    ],
)
def test_session_keys_are_distinct_for_distinct_pairs(
    first: tuple[str, str | None], second: tuple[str, str | None]
) -> None:
    assert session_ctx_id(*first) != session_ctx_id(*second)
    assert len(session_ctx_id(*first)) <= 1024


def test_plain_ids_keep_agentscopes_session_key() -> None:
    assert session_ctx_id("s1", "u1") == "s1_u1"
    assert session_ctx_id("s1") == "s1"


# Holds the sandbox past the server's time limit (4 s): the agent's alarm is ignored, so the
# server ends it after its grace (7 s in all).
HOLD_PAST_THE_LIMIT = (
    "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(30)"
)


async def test_a_call_that_cannot_start_within_its_time_limit_is_not_run(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    holding = asyncio.create_task(box.run_ipython_cell_async(HOLD_PAST_THE_LIMIT))
    await asyncio.sleep(0.3)
    started = time.perf_counter()
    with pytest.raises(SandboxUnavailableError) as refused:
        await box.run_shell_command_async("touch /workspace/queued")
    assert 3.5 < time.perf_counter() - started < 6
    assert "waited 4 s" in str(refused.value) and "was not run" in str(refused.value)
    assert (await holding)["isError"] is True
    listing = await box.run_shell_command_async("ls /workspace")
    assert "queued" not in (part(listing, "stdout") or "")


async def test_a_call_whose_client_left_while_it_waited_is_not_run(
    sandbox_server: RunningServer, sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    holding = asyncio.create_task(box.run_shell_command_async("sleep 2"))
    await asyncio.sleep(0.3)
    impatient = SandboxClient(sandbox_server.url, sandbox_server.token, timeout=0.5)
    try:
        with pytest.raises(SandboxUnavailableError, match="did not answer in time"):
            await impatient.call_tool(
                box.sandbox_id, "run_shell_command", {"command": "touch /workspace/late"}
            )
    finally:
        await impatient.aclose()
    assert (await holding)["isError"] is False
    await asyncio.sleep(0.5)
    listing = await box.run_shell_command_async("ls /workspace")
    assert "late" not in (part(listing, "stdout") or "")


async def test_stop_ends_the_running_call_and_refuses_those_waiting(
    sandbox_service: SandboxService, session_id: str
) -> None:
    [box] = await sandbox_service.connect_async(session_id)
    client = sandbox_service.client
    running = asyncio.create_task(
        box.run_shell_command_async(
            "echo begun >> /workspace/log; sleep 3; echo ended >> /workspace/log"
        )
    )
    await asyncio.sleep(0.5)
    waiting = asyncio.create_task(box.run_shell_command_async("echo queued >> /workspace/log"))
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    assert await client.stop(box.sandbox_id) is True
    assert time.perf_counter() - started < 2.5
    assert await client.get_status(box.sandbox_id) == "exited"
    stopped = await running
    assert stopped["isError"] is True
    assert "stopped during the call" in (part(stopped, "stderr") or "")
    with pytest.raises(SandboxRequestError, match="stopped while this call waited"):
        await waiting
    await asyncio.sleep(3)  # past the end the running call would have had
    assert await client.start(box.sandbox_id) is True
    log = await box.run_shell_command_async("cat /workspace/log")
    assert part(log, "stdout") == "begun\n"
