"""Where a webhook may go: the egress policy, checked on the URL's text when it is scheduled and on
the resolved address when it is sent.

A webhook URL comes from whoever schedules the execution (a user, or an agent's tool call), so it
is hostile until checked. Always refused: link-local addresses (cloud metadata services live at
169.254.169.254 and fd00:ec2::254), multicast, unspecified and reserved addresses. Refused unless
an operator allows them (``MARKETING_WEBHOOK_ALLOW_NETWORKS``, CIDRs): loopback, private and other
non-global ranges, where the database and internal services live.

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


class EgressRefused(ValueError):
    """The destination is not allowed; the message names the address, why, and the setting."""


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


@dataclass(frozen=True)
class EgressPolicy:
    allow: tuple[IPNetwork, ...] = ()

    def refusal(self, address: IPAddress) -> str | None:
        """Why ``address`` may not be a webhook's destination, or None when it may."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
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
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
        if host in METADATA_HOSTS:
            raise EgressRefused(f"webhook host {host} is a cloud metadata service, never allowed")
        # localhost names loopback by definition (RFC 6761), whatever a resolver would say.
        address = ipaddress.ip_address("127.0.0.1") if host == "localhost" or host.endswith(".localhost") else None
        address = address or literal_address(host)
        if address is not None and (reason := self.refusal(address)):
            raise EgressRefused(f"webhook address {address} is {reason}")

    def resolve(self, host: str, port: int) -> IPAddress:
        """The send-time check: every address ``host`` resolves to must be allowed; returns the first."""
        self.check_url(f"http://{host}/")
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
