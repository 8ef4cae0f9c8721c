"""Where a webhook may go: the egress policy, checked on the URL's text when it is scheduled and on
the resolved address when it is sent.

A webhook URL comes from whoever schedules the execution (a user, or an agent's tool call), so it
is hostile until checked. Always refused: link-local addresses (cloud metadata services live at
169.254.169.254 and fd00:ec2::254), multicast, unspecified and reserved addresses. Refused unless
an operator allows them (``MARKETING_WEBHOOK_ALLOW_NETWORKS``, CIDRs): loopback, private and other
non-global ranges, where the database and internal services live.

An IPv6 address that carries an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible
``::a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48``, a Teredo client in
``2001::/32``) is refused when that IPv4 address would be: a relay or translator delivers the packet
to it, so ``2002:7f00:1::`` is 127.0.0.1 and ``64:ff9b::a9fe:a9fe`` the metadata service.

The check that counts happens at send time, on every address the host resolves to, and the request
then goes to the address that was checked (the Host header and TLS server name keep the host's
name): a name that resolved to a public address when scheduled and to 127.0.0.1 now (DNS
rebinding) is refused.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata services that are not link-local (Alibaba Cloud; AWS's IPv6 endpoint is in fd00::/8).
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254"))
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal"})
ALLOW_SETTING = "MARKETING_WEBHOOK_ALLOW_NETWORKS"
# IPv6 forms whose last 32 bits are the IPv4 address (RFC 6052's /96 layout for NAT64). The local-use
# NAT64 prefix may also be laid out with a shorter prefix; only its /96 layout is read, and its IPv6
# form is refused as reserved (it lies in ::/8) whatever the IPv4 address.
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


class EgressRefused(ValueError):
    """The destination is not allowed; the message names the address, why, and the setting."""


def api_root_problem(url: str) -> str | None:
    """Why ``url`` cannot be an outside service's API root (an importer's, a model provider's), or None.

    User info is refused: httpx turns ``user:password@`` into an ``Authorization: Basic`` header that replaces
    the service's own credential, and the URL is quoted in errors. The service's key has its own setting.
    """
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 -- raises ValueError on a port that is not a number in range
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if "@" in parts.netloc:
        return "must not hold user info (user:password@): the service's credential has its own setting"
    return None


def parse_networks(value: str | Iterable[str]) -> tuple[IPNetwork, ...]:
    """``"127.0.0.1/32, 10.0.0.0/8"`` -> networks; raises ValueError naming the bad entry."""
    items = value.split(",") if isinstance(value, str) else list(value)
    networks = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP network (e.g. 127.0.0.1/32 or 10.0.0.0/8)") from None
    return tuple(networks)


def literal_address(host: str) -> IPAddress | None:
    """The address a host names literally, including the forms resolvers accept (``0x7f000001``,
    ``2130706433``, ``127.1``), or None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host):
        try:
            return ipaddress.ip_address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, 6to4, NAT64, Teredo client), or None."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    in_compatible = address in IPV4_COMPATIBLE and int(address) > 1  # :: and ::1 are IPv6's own
    if address in NAT64_WELL_KNOWN or address in NAT64_LOCAL_USE or in_compatible:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


@dataclass(frozen=True)
class EgressPolicy:
    allow: tuple[IPNetwork, ...] = ()

    def refusal(self, address: IPAddress) -> str | None:
        """Why ``address`` may not be a webhook's destination, or None when it may."""
        if isinstance(address, ipaddress.IPv6Address) and (ipv4 := embedded_ipv4(address)) is not None:
            if reason := self.refusal(ipv4):
                return f"an IPv6 form of {ipv4}, {reason}"
            if address.ipv4_mapped is not None or address in NAT64_WELL_KNOWN:
                # Sent to the IPv4 address itself (by a dual-stack socket, by the NAT64 translator).
                return None
        if address in METADATA_ADDRESSES or address.is_link_local:
            return "a link-local or cloud metadata address, never allowed"
        # ::1 counts as "reserved" to Python (it lies in ::/8): loopback is decided first.
        if not address.is_loopback and (address.is_multicast or address.is_unspecified or address.is_reserved):
            return "a multicast, unspecified or reserved address, never allowed"
        if address.is_global:
            return None
        if any(address in network for network in self.allow):
            return None
        kind = "a loopback" if address.is_loopback else "a private or internal"
        return f"{kind} address; an operator can allow it with {ALLOW_SETTING}"

    def check_url(self, url: str) -> None:
        """The schedule-time check: an IP literal (in any form) or a metadata host name is refused."""
        self.check_host(urlsplit(url).hostname or "")

    def check_host(self, host: str) -> None:
        """``host`` as a URL names it (an IPv6 literal with or without its brackets) checked on its text."""
        host = host.rstrip(".").lower()
        if host in METADATA_HOSTS:
            raise EgressRefused(f"webhook host {host} is a cloud metadata service, never allowed")
        # localhost names loopback by definition (RFC 6761), whatever a resolver would say.
        address = ipaddress.ip_address("127.0.0.1") if host == "localhost" or host.endswith(".localhost") else None
        address = address or literal_address(host)
        if address is not None and (reason := self.refusal(address)):
            raise EgressRefused(f"webhook address {address} is {reason}")

    def resolve(self, host: str, port: int) -> IPAddress:
        """The send-time check: every address ``host`` resolves to must be allowed; returns the first."""
        # Not through a URL: an unbracketed IPv6 literal there would parse as a host name and a port.
        self.check_host(host)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise OSError(f"cannot resolve {host}: {exc.strerror or exc}") from None
        addresses: Sequence[IPAddress] = list(
            dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)
        )
        for address in addresses:
            if reason := self.refusal(address):
                raise EgressRefused(f"webhook host {host} resolves to {address}, {reason}")
        return addresses[0]


# The policy of a deployment that allows no network (MARKETING_WEBHOOK_ALLOW_NETWORKS unset): a caller that
# passes no policy gets the strictest one, never one read from its own environment.
PUBLIC_ONLY = EgressPolicy()
