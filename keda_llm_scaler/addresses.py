"""Which addresses the scaler may scrape, checked on the address it really connects to.

A tenant names replicas (``endpoints``, ``dnsName``) or the cluster does (EndpointSlices, pods); either way
the scaler must never be made to fetch a cloud metadata service or another link-local host. Checking the
text of a URL is not enough: ``2852039166``, ``0xa9fea9fe``, ``169.254.43518`` and ``169。254。169。254``
are all 169.254.169.254 to the C library, and a host name can resolve anywhere, at any time. So:

* ``normalize_host`` turns every spelling the resolver accepts into one canonical form (IDNA, then the
  ``inet_aton`` numeric forms as dotted IPv4), and ``refusal`` says why an address or name is refused;
* ``AddressPolicy`` adds what the operator refuses on top (``--refuse-networks``, e.g. ``loopback``: the
  scaler's own pod) or confines scrapes to (``--allow-networks``, e.g. the pod CIDR), process-wide;
* ``GuardedResolver`` is the scrape client's resolver: it resolves the host itself, drops refused
  addresses and hands the connector only checked ones, so what was checked is what is connected to (no
  time-of-check/time-of-use gap through a DNS answer that changes).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Final

from aiohttp.abc import AbstractResolver, ResolveResult

__all__ = [
    "NETWORK_ALIASES",
    "REFUSED_NAMES",
    "AddressPolicy",
    "GuardedResolver",
    "RefusedAddress",
    "embedded_ipv4",
    "normalize_host",
    "parse_networks",
    "redact",
    "refusal",
    "set_policy",
]

# Names of metadata services that answer on link-local addresses (and some that resolve elsewhere).
REFUSED_NAMES: Final = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
        "metadata.platformequinix.com",
    }
)
_LINK_LOCAL_V4: Final = ipaddress.ip_network("169.254.0.0/16")
_LINK_LOCAL_V6: Final = ipaddress.ip_network("fe80::/10")
_AWS_IMDS_V6: Final = ipaddress.ip_network("fd00:ec2::/32")
_NUMERIC: Final = frozenset("0123456789abcdefx.")
# IPv6 forms that carry an IPv4 address a packet can end up at (RFC 4291 compatible, RFC 6052 NAT64)
_V4_COMPATIBLE: Final = ipaddress.ip_network("::/96")
_NAT64_WELL_KNOWN: Final = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL: Final = ipaddress.ip_network("64:ff9b:1::/48")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Names accepted by --refuse-networks / --allow-networks besides CIDRs.
NETWORK_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "loopback": ("127.0.0.0/8", "::1/128"),
    # RFC 1918, shared address space (RFC 6598, carrier NAT and some clusters' pod ranges), unique local v6
    "private": ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"),
}


def parse_networks(raw: str, flag: str) -> tuple[Network, ...]:
    """Comma-separated CIDRs or aliases (``loopback``, ``private``); ValueError naming ``flag``."""
    networks: list[Network] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        for cidr in NETWORK_ALIASES.get(item.lower(), (item,)):
            try:
                networks.append(ipaddress.ip_network(cidr, strict=False))
            except ValueError:
                raise ValueError(
                    f"{flag} {item!r}: accepted: comma-separated CIDRs (10.244.0.0/16, fd00::/8) or "
                    f"{' | '.join(NETWORK_ALIASES)}"
                ) from None
    return tuple(networks)


class AddressPolicy:
    """What the operator refuses beyond the fixed rules, or confines scraping to."""

    def __init__(self, refuse: tuple[Network, ...] = (), allow: tuple[Network, ...] = ()) -> None:
        self.refuse = refuse
        self.allow = allow

    def refusal(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        for net in self.refuse:
            if ip.version == net.version and ip in net:
                return f"{ip} is in refused network {net} (--refuse-networks)"
        if self.allow and not any(ip.version == net.version and ip in net for net in self.allow):
            return f"{ip} is outside --allow-networks"
        return None


_policy = AddressPolicy()


def set_policy(policy: AddressPolicy) -> AddressPolicy:
    """Install the process-wide policy (``serve`` does, from its flags); returns the previous one."""
    global _policy
    previous, _policy = _policy, policy
    return previous


class RefusedAddress(OSError):
    """The scrape client refused to connect to an address (reported as ``refused_address``)."""


def redact(url: str) -> str:
    """A URL fit for logs: no query string or credentials (a ``?token=`` must not end up in a log)."""
    base, sep, _ = url.partition("?")
    scheme, _, rest = base.partition("://")
    rest = rest.split("@", 1)[-1]
    return f"{scheme}://{rest}" + ("?…" if sep else "")


def normalize_host(host: str) -> str:
    """The canonical form of a URL host: no brackets or trailing dot, IDNA (so full-width and ideographic
    dots are dots), lower case, and any numeric IPv4 spelling ``inet_aton`` accepts as dotted quad."""
    h = host.strip().strip("[]").rstrip(".")
    if ":" in h:  # IPv6 literal (a zone id is not an address we scrape)
        try:
            return str(ipaddress.ip_address(h.split("%", 1)[0]))
        except ValueError:
            return h.lower()
    try:
        h = h.encode("idna").decode("ascii")
    except UnicodeError:
        return h.lower()
    h = h.lower()
    if h and set(h) <= _NUMERIC:
        try:
            return socket.inet_ntoa(socket.inet_aton(h))
        except OSError:
            pass
    return h


def refusal(host_or_ip: str) -> str | None:
    """Why this (normalised) host or address may not be scraped, or None."""
    h = normalize_host(host_or_ip)
    if h in REFUSED_NAMES:
        return f"{h} is a metadata service name"
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return None  # a name: checked again on what it resolves to
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip in _AWS_IMDS_V6:
            return f"{ip} is a metadata service address"
        else:
            for v4 in embedded_ipv4(ip):  # an IPv4 inside the IPv6 one: checked as that IPv4 is
                why = refusal(str(v4))
                if why is not None:
                    return f"{ip} embeds {v4}: {why}"
    if ip in _LINK_LOCAL_V4 or ip in _LINK_LOCAL_V6:
        return f"link-local address {ip}"
    if ip.is_multicast or ip.is_unspecified:
        return f"{ip} is not a unicast host"
    return _policy.refusal(ip)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries: IPv4-compatible (``::a.b.c.d``), 6to4 (2002::/16),
    Teredo (2001::/32: server and client) and NAT64 (64:ff9b::/96, and 64:ff9b:1::/48 per RFC 6052)."""
    out: list[ipaddress.IPv4Address] = []
    n = int(ip)
    if ip in _V4_COMPATIBLE and n > 1:  # :: and ::1 are not IPv4-compatible addresses
        out.append(ipaddress.IPv4Address(n & 0xFFFFFFFF))
    if ip in _NAT64_WELL_KNOWN:
        out.append(ipaddress.IPv4Address(n & 0xFFFFFFFF))
    if ip in _NAT64_LOCAL:  # /48 prefix: IPv4 bits 48-63 and 72-87, around the u octet
        out.append(ipaddress.IPv4Address(((n >> 64) & 0xFFFF) << 16 | ((n >> 40) & 0xFFFF)))
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip.teredo is not None:
        out.extend(ip.teredo)
    return out


class GuardedResolver(AbstractResolver):
    """The scrape client's resolver: resolve, drop refused addresses, hand the checked ones to the
    connector, which connects to exactly those (no second lookup to race). IP literals never reach a
    resolver in aiohttp: the scraper checks them before the request."""

    def __init__(self, resolve_timeout_s: float = 5.0) -> None:
        self._resolve_timeout_s = resolve_timeout_s

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        why = refusal(host)
        if why is not None:
            raise RefusedAddress(why)
        h = normalize_host(host)
        try:
            addresses = [(str(ipaddress.ip_address(h)), socket.AF_INET6 if ":" in h else socket.AF_INET)]
        except ValueError:
            loop = asyncio.get_running_loop()
            try:
                infos = await asyncio.wait_for(
                    loop.getaddrinfo(h, port, type=socket.SOCK_STREAM, family=family), self._resolve_timeout_s
                )
            except TimeoutError:
                raise OSError(f"resolving {h} timed out") from None
            except socket.gaierror as exc:
                raise OSError(f"resolving {h}: {exc.strerror}") from None
            addresses = list(dict.fromkeys((str(i[4][0]).split("%", 1)[0], i[0]) for i in infos))
        reasons = {a: refusal(a) for a, _ in addresses}
        allowed = [(a, fam) for a, fam in addresses if reasons[a] is None]
        if not allowed:
            first = next(iter(reasons.values()), None)
            raise RefusedAddress(f"{h} resolves only to refused addresses ({first})")
        return [
            ResolveResult(hostname=host, host=a, port=port, family=fam, proto=0, flags=socket.AI_NUMERICHOST)
            for a, fam in allowed
        ]

    async def close(self) -> None:
        pass
