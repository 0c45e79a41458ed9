"""The two paths: ingestion (actor -> buffer) and delivery (buffer -> learner), on one spine (:mod:`.base`)."""

from conduit.paths.base import DataPath
from conduit.paths.delivery import DeliveryPath, DeliveryStats
from conduit.paths.ingestion import IngestionPath, IngestionStats
from conduit.paths.minibatch import MinibatchDelivery
from conduit.paths.replay import ReplayDelivery

__all__ = [
    "DataPath",
    "DeliveryPath",
    "DeliveryStats",
    "IngestionPath",
    "IngestionStats",
    "MinibatchDelivery",
    "ReplayDelivery",
]
