"""The kernel stacks 500 lower layers: a workspace holds the base and 499 done tasks (fake
tasks and the owner's uploads, each a done task with a layer)."""

import json

from testbed.box_api import finish, http, start_fake
from testbed.machine import Machine

# Fills the workspace's stack with 498 done tasks: the first and the last EACH_END numbers are
# fake tasks started eight at a time over the HTTP API, waited for until each has ended; the rest,
# in between and beside them, are the owner's uploads (PUT), each a done task of worker "owner"
# with a layer of its own in the same stack (boxd/manager/owner_changes.py), made in a fraction of
# a task's time: the test is about the depth of the stack, not how its layers were made. Prints
# how many of each worker ended in each state, and why any failed.
FILL = """
import asyncio, json, sys
import aiohttp

API = "http://127.0.0.1:7700/api"

async def main(token, workspace, count, each_end):
    headers = {"Authorization": f"Bearer {token}"}
    gate = asyncio.Semaphore(8)
    errors = []
    async with aiohttp.ClientSession(headers=headers) as http:
        async def task(number):
            async with gate:
                body = {"title": f"layer {number}", "worker": "fake", "workspace": workspace,
                        "prompt": f"write n{number}.txt {number}"}
                async with http.post(f"{API}/tasks", json=body) as answer:
                    task = await answer.json()
                while task["state"] not in ("done", "failed"):
                    await asyncio.sleep(0.2)
                    async with http.get(f"{API}/tasks/{task['id']}") as answer:
                        task = await answer.json()
                if task["state"] != "done":
                    errors.append(f"{task['id']}: {task.get('error')}")
                return f"{task['worker']} {task['state']}"

        async def upload(number):
            url = f"{API}/workspaces/{workspace}/files/n{number}.txt"
            async with http.put(url, data=str(number).encode()) as answer:
                change = await answer.json()
            if answer.status != 201 or change.get("state") != "done":
                errors.append(f"upload {number}: {answer.status} {change}")
            return f"{change.get('worker')} {change.get('state')}"

        async def uploads(numbers):
            return [await upload(number) for number in numbers]

        ends = [*range(each_end), *range(count - each_end, count)]
        states = await asyncio.gather(
            uploads(range(each_end, count - each_end)), *(task(n) for n in ends)
        )
        states = [*states[0], *states[1:]]
    print(json.dumps({state: states.count(state) for state in set(states)}))
    print(json.dumps(errors))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""
EACH_END = 4


def test_499_done_tasks_and_the_500th_refused(machine: Machine, token: str) -> None:
    status, _ = http(machine, "POST", "/api/workspaces", token, json.dumps({"name": "deep"}))
    assert status == 201
    filled = machine.run(
        "/usr/lib/boxd/venv/bin/python",
        "-c",
        FILL,
        token,
        "deep",
        "498",
        str(EACH_END),
        timeout=900,
    )
    counts, errors = filled.stdout.splitlines()
    assert json.loads(counts) == {
        "fake done": 2 * EACH_END,
        "owner done": 498 - 2 * EACH_END,
    }, errors
    # The 499th sees all 498 below it, through one overlay of 499 lower layers with the base.
    last = start_fake(machine, token, "sh ls | wc -l; cat n0.txt n497.txt", workspace="deep")
    assert len(last["saw"]) == 498
    ended = finish(machine, last["id"])
    assert ended["state"] == "done", ended
    assert ended["steps"][0]["text"] == "498\n0497"
    # The owner's view stacks all 499 done layers over the base too, remade at each join.
    view = "/run/boxd/views/deep"
    assert machine.run("sh", "-c", f"ls {view} | wc -l; cat {view}/n0.txt").stdout == "498\n0"
    options = machine.run("findmnt", "-n", "-o", "OPTIONS", "-T", f"{view}/").stdout
    lowers = options.split("lowerdir=")[1].split(",")[0].split(":")
    assert len(lowers) == 500
    refused = start_fake(machine, token, "step too deep", workspace="deep")
    assert refused["state"] == "failed"
    assert refused["error"] == (
        "Workspace deep already holds 499 finished tasks, the most it can stack: undo some of "
        "them, or start the task on another workspace."
    )
