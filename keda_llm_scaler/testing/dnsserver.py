"""A real DNS server on loopback (UDP), for dnsName discovery tests.

It answers from a zone held in memory, the way cluster DNS answers for headless Services: A/AAAA
records for names it has, NOERROR without answers (NODATA) for names it has no records of that type
for, NXDOMAIN for the rest, and silence for names marked ``hang``. It counts the queries it got.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass, field
from typing import cast

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset

HANG = "hang"


@dataclass
class Zone:
    # name (no trailing dot, lower case) -> addresses; an empty list is a name without records (NODATA)
    records: dict[str, list[str]] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    queries: list[tuple[str, str]] = field(default_factory=list)

    def answer(self, wire: bytes) -> bytes | None:
        query = dns.message.from_wire(wire)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rdtype))
        if name in self.hang:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response.to_wire()
        family = 4 if rdtype == "A" else 6 if rdtype == "AAAA" else 0
        addresses = [a for a in self.records[name] if ipaddress.ip_address(a).version == family]
        if addresses:
            response.answer.append(dns.rrset.from_text_list(question.name, 5, "IN", rdtype, addresses))
        return response.to_wire()


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, zone: Zone) -> None:
        self._zone = zone
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = self._zone.answer(data)
        if reply is not None and self._transport is not None:
            self._transport.sendto(reply, addr)


class DnsServer:
    def __init__(self, zone: Zone) -> None:
        self.zone = zone
        self.port = 0
        self._transport: asyncio.DatagramTransport | None = None

    async def __aenter__(self) -> DnsServer:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self.zone), local_addr=("127.0.0.1", 0))
        self._transport = transport
        self.port = transport.get_extra_info("sockname")[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            self._transport.close()

    @property
    def nameservers(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.port)]
