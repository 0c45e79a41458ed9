"""The delivery path: buffer rows become training-ready batches on each learner's device.

Graph: ``select+gather -> hook -> to_learner -> split`` (processing, processing,
transfer, processing). One invocation handles ``g`` training batches: off-policy
it samples ``g·B`` rows in one gather and splits them into ``g`` batches; on-policy
``g = 1`` prepares an epoch's ``M`` mini-batches at once and ``g = 1/M`` one
mini-batch at a time.

Timing (``overlap``): inline runs an invocation in the pulling thread when that
learner has nothing staged; overlapped lets the path's worker stage at most one
invocation ahead per learner (so a staged batch is at most ``g`` batches older
than an inline sample would have been), on a dedicated CUDA stream whose event
the learner's stream waits on at hand-off.

Each learner has its own staging queue and pull counter; several data-parallel
learners each pull their own batches.
"""

from conduit.delivery.base import DeliveryPath, DeliveryStats
from conduit.delivery.minibatch import MinibatchDelivery
from conduit.delivery.replay import ReplayDelivery

__all__ = ["DeliveryPath", "DeliveryStats", "MinibatchDelivery", "ReplayDelivery"]
