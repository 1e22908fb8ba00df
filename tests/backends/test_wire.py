"""The messages that cross process and actor boundaries, and their framing."""

from __future__ import annotations

import os
import pickle
import socket
from multiprocessing.connection import Connection

import pytest

from conveyor.backends import wire
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.engine.messages import ErrorInfo, Handle

ERROR = ErrorInfo("ValueError", "bad input")
HANDLE = Handle(b"payload", 7, "3.1")

MESSAGES = [
    wire.Init(["/src"], "/dev/shm/run", NodeInfo("local", 4)),
    wire.StartHost("decode", "/dev/shm/run/stage-0.pkl", True),
    wire.Fork("decode-0", WorkerInfo("decode-0", "decode", "local"), {"A": "1"}),
    wire.Exit(),
    wire.Hello(1234),
    wire.Loaded(),
    wire.LoadFailed(ERROR),
    wire.Forked("decode-0", 1235),
    wire.ForkFailed("decode-1", ERROR),
    wire.Exited("decode-0", "killed by signal 9 (SIGKILL)"),
    wire.Work([(5, [HANDLE])], 2, None),
    wire.More(5, 3),
    wire.Stop(now=True),
    wire.Ready(0.5, 1 << 20),
    wire.SetupFailed(ERROR),
    wire.Out(5, [HANDLE]),
    wire.Done([5], [[HANDLE]], [0], [0.1], [0.2], [0.05], [wire.Failed(6, ERROR)], 1 << 20),
    wire.Stopped(),
    wire.Placed("node-a", 99),
    wire.Ran(5, [wire.Output("3.1", b"x", 1, True)], 0, 0.1, 0.2, 0.05, 0),
    wire.Made("3.1.0", 10, False, None),
    wire.Ended(1, 0.1, 0.2, 0.05, 0),
    wire.Raised(ERROR),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_each_message_arrives_as_the_same_named_message(message: object) -> None:
    back = pickle.loads(pickle.dumps(message, protocol=5))
    assert type(back) is type(message) and back == message


def test_a_worker_reads_its_messages_with_match() -> None:
    def act(message: object) -> str:
        match message:
            case wire.Work(batches, threads, None):
                return f"run {len(batches)} on {threads}"
            case wire.More(batch_id, outputs):
                return f"{batch_id} may make {outputs} more"
            case wire.Stop(now=True):
                return "stop now"
            case wire.Stop():
                return "stop"
        return "ignored"

    assert act(wire.Work([(1, [HANDLE])], 4)) == "run 1 on 4"
    assert act(wire.More(1, 2)) == "1 may make 2 more"
    assert (act(wire.Stop()), act(wire.Stop(True)), act(("work",))) == (
        "stop",
        "stop now",
        "ignored",
    )


def test_a_connection_carries_messages_in_order() -> None:
    ours, theirs = socket.socketpair()
    a, b = Connection(ours.detach()), Connection(theirs.detach())
    try:
        for message in MESSAGES[10:18]:
            wire.send(a, message)
        assert [wire.recv(b) for _ in MESSAGES[10:18]] == MESSAGES[10:18]
        a.close()
        with pytest.raises(EOFError):
            wire.recv(b)
    finally:
        b.close()


def test_a_control_message_brings_its_descriptor_and_eof_is_none() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    extra_r, extra_w = os.pipe()
    try:
        wire.send_ctrl(ours, wire.StartHost("s", "/tmp/s.pkl", False), [extra_r])
        got = wire.recv_ctrl(theirs)
        assert got is not None
        message, fds = got
        assert message == wire.StartHost("s", "/tmp/s.pkl", False) and len(fds) == 1
        os.write(extra_w, b"!")
        assert os.read(fds[0], 1) == b"!"  # the same pipe, now the receiver's
        os.close(fds[0])
        ours.close()
        assert wire.recv_ctrl(theirs) is None
    finally:
        theirs.close()
        os.close(extra_r)
        os.close(extra_w)
