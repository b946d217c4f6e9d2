"""The job-wide half of PMI, kept by the controller: barrier completion and the name service."""

from __future__ import annotations


class JobKvs:
    """Collects each host's puts at a barrier of one job; once every host is in, all go to all."""

    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        self.entered: set[int] = set()
        self.batch: dict[str, str] = {}

    def fence(self, host: int, kvs: dict[str, str]) -> dict[str, str] | None:
        """Record one host's arrival; the merged puts when it was the last one, else None."""
        self.entered.add(host)
        self.batch.update(kvs)
        if len(self.entered) < self.hosts:
            return None
        merged, self.batch, self.entered = self.batch, {}, set()
        return merged


class NameService:
    """MPI_Publish_name and friends, shared by every job of the run."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def request(self, cmd: str, service: str, port: str | None) -> dict[str, object]:
        """MPI_Publish_name / Unpublish_name / Lookup_name, as PMI-1 result fields."""
        if not service:
            return {"rc": -1, "msg": "no_service_name"}
        if cmd == "publish_name":
            if service in self.names:
                return {"rc": -1, "msg": "service_already_published"}
            self.names[service] = port or ""
            return {"rc": 0, "info": "ok"}
        if cmd == "unpublish_name":
            if self.names.pop(service, None) is None:
                return {"rc": -1, "msg": "service_not_published"}
            return {"rc": 0, "info": "ok"}
        if service not in self.names:
            return {"rc": -1, "msg": "service_not_found"}
        return {"rc": 0, "port": self.names[service], "info": "ok"}
