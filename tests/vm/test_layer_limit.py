"""The kernel stacks 500 lower layers: a workspace holds the base and 499 done tasks."""

import json

from testbed.box_api import finish, http, start_fake
from testbed.machine import Machine

# Starts tasks eight at a time over the HTTP API and waits until each has ended; prints how many
# ended in each state and why any failed.
FILL = """
import asyncio, json, sys
import aiohttp

async def main(token, workspace, count):
    headers = {"Authorization": f"Bearer {token}"}
    gate = asyncio.Semaphore(8)
    errors = []
    async with aiohttp.ClientSession(headers=headers) as http:
        async def one(number):
            async with gate:
                body = {"title": f"layer {number}", "worker": "fake", "workspace": workspace,
                        "prompt": f"write n{number}.txt {number}"}
                async with http.post("http://127.0.0.1:7700/api/tasks", json=body) as answer:
                    task = await answer.json()
                while task["state"] not in ("done", "failed"):
                    await asyncio.sleep(0.2)
                    url = f"http://127.0.0.1:7700/api/tasks/{task['id']}"
                    async with http.get(url) as answer:
                        task = await answer.json()
                if task["state"] != "done":
                    errors.append(f"{task['id']}: {task.get('error')}")
                return task["state"]
        states = await asyncio.gather(*(one(n) for n in range(count)))
    print(json.dumps({state: states.count(state) for state in set(states)}))
    print(json.dumps(errors))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_499_done_tasks_and_the_500th_refused(machine: Machine, token: str) -> None:
    status, _ = http(machine, "POST", "/api/workspaces", token, json.dumps({"name": "deep"}))
    assert status == 201
    filled = machine.run(
        "/usr/lib/boxd/venv/bin/python", "-c", FILL, token, "deep", "498", timeout=900
    )
    counts, errors = filled.stdout.splitlines()
    assert json.loads(counts) == {"done": 498}, errors
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
