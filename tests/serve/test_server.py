"""Starting the server: who may listen where without a key, the socket, the app it builds."""

from __future__ import annotations

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.serve.server import API_KEY_ENV, ServeOptions, bind, is_loopback, resolve_api_key


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("127.0.0.2", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.5", False), ("example.org", False)])
def test_is_loopback(host, loopback) -> None:
    assert is_loopback(host) is loopback


def test_beyond_loopback_needs_a_key_or_an_explicit_allowance(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key(ServeOptions()) is None
    with pytest.raises(ConfigError, match="--api-key"):
        resolve_api_key(ServeOptions(host="0.0.0.0"))
    assert resolve_api_key(ServeOptions(host="0.0.0.0", allow_no_key=True)) is None
    assert resolve_api_key(ServeOptions(host="0.0.0.0", api_key="k")) == "k"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(ServeOptions(host="0.0.0.0")) == "from-env"


def test_bind_a_free_port() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()
    with pytest.raises(ConfigError):
        bind("127.0.0.1", -1)
