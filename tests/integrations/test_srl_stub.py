"""The SRL-protocol stub (:mod:`.srl_stub`) against SRL's documented buffer protocol (docs/srl.md)."""

from __future__ import annotations

from .srl_stub import DequeSampleConsumer, StepLog, ids_of, make_buffer, make_consumer, sample, trainer_step


def test_the_stub_queue_is_freshest_first_with_reuse():
    buf = make_buffer("priority_queue", max_size=8, reuses=2, batch_size=2)
    for i in range(4):
        buf.put(sample(i))
    got = [ids_of(buf.get().sample).tolist() for _ in range(4)]
    assert got == [[2, 3], [0, 1], [2, 3], [0, 1]]


def test_the_stub_trainer_step_filters_stale_samples():
    buf = make_buffer("priority_queue", batch_size=1)
    buf.put(sample(0, version=-1))
    log = StepLog()
    trainer_step(buf, log)
    trainer_step(buf, log)
    assert (log.skipped, log.idle, log.trained) == (1, 1, [])


def test_the_stub_stream_consumes_in_order():
    stream = DequeSampleConsumer()
    for i in range(5):
        stream.post(i)

    class Sink:
        def __init__(self):
            self.got = []

        def put(self, x):
            self.got.append(x)

    sink = Sink()
    assert stream.consume_to(sink, max_iter=3) == 3 and sink.got == [0, 1, 2]
    assert make_consumer(stream) is stream
