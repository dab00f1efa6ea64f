"""The guards in front of the routes, against a live server on 127.0.0.1 over real sockets: request bodies bounded in
size and time and only JSON, the Host and Origin checks, API keys."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.serve.conftest import Served, read_status, save_served_model, start_server
from transformer_xl.serve.guard import KeyGuard, host_name, is_json
from transformer_xl.serve.protocol import Limits

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

LIMIT = 64 * 1024
JSON = {"Content-Type": "application/json"}
ASK = {"prompt": "the cat", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server without a key, bodies of at most 64 KiB within 0.5 s, one proxy name allowed."""
    yield from start_server(save_served_model(tmp_path_factory.mktemp("guard")), limits=Limits(max_body_bytes=LIMIT),
                            body_timeout=0.5, allowed_hosts=("proxy.example",))


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with two API keys."""
    yield from start_server(save_served_model(tmp_path_factory.mktemp("keyed")), api_key=["key-one", "key-two"])


def _head(method: str, path: str, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k.replace('_', '-')}: {v}"
                                                               for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_body_announced_over_the_limit_is_refused_before_it_is_sent(small) -> None:
    sock = small.raw(_head("POST", "/v1/completions", Content_Type="application/json", Content_Length="100000000"))
    start = time.monotonic()
    status, data = read_status(sock, 5)
    assert status == 413 and time.monotonic() - start < 2, data[:200]
    assert b'"code":"body_too_large"' in data.replace(b" ", b"") and b"--max-body-bytes" in data


@pytest.mark.parametrize("size", [LIMIT + 1, 8 << 20])
def test_pythons_urllib_which_sends_the_whole_body_first_reads_the_413(small, size: int) -> None:
    """urllib writes the whole body before it reads: a server that answers and closes at once resets the
    connection under it (a broken pipe, the answer lost). The server reads on, for a bounded number of bytes and
    seconds, what follows a refusal (nginx's lingering close)."""
    import json
    import urllib.error
    import urllib.request

    ask = urllib.request.Request(f"http://127.0.0.1:{small.port}/v1/completions", data=b" " * size, headers=JSON)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(ask, timeout=30)
    assert refused.value.code == 413
    assert json.loads(refused.value.read())["error"]["code"] == "body_too_large"


def test_requests_and_the_openai_client_read_the_413_as_well(small) -> None:
    """The clients that read while they send (requests, httpx under the openai client) keep reading the refusal
    with the lingering close."""
    requests = pytest.importorskip("requests")
    openai = pytest.importorskip("openai")

    got = requests.post(f"http://127.0.0.1:{small.port}/v1/completions", data=b" " * (8 << 20), headers=JSON,
                        timeout=30)
    assert got.status_code == 413 and got.json()["error"]["code"] == "body_too_large"
    with pytest.raises(openai.APIStatusError) as refused:
        small.client().completions.create(model="tiny", prompt="the " * (2 << 20), max_tokens=1)
    assert refused.value.status_code == 413



def test_curl_reads_the_413(small, tmp_path) -> None:
    import shutil
    import subprocess

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = tmp_path / "body.json"
    body.write_bytes(b" " * (8 << 20))
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
                          "--data-binary", f"@{body}", f"http://127.0.0.1:{small.port}/v1/completions"],
                         capture_output=True, text=True, timeout=60)
    text, _, status = out.stdout.rpartition("\n")
    assert status == "413" and '"body_too_large"' in text, (out.returncode, out.stdout[-500:], out.stderr[-500:])


def _send_until_closed(sock: socket.socket, chunk: bytes, every: float, within: float) -> tuple[float, int]:
    """Send ``chunk`` every ``every`` seconds until the server closes ``sock``: (seconds, bytes sent)."""
    start, sent = time.monotonic(), 0
    try:
        while time.monotonic() - start < within:
            sock.sendall(chunk)
            sent += len(chunk)
            time.sleep(every)
    except OSError:
        pass
    finally:
        sock.close()
    return time.monotonic() - start, sent


def test_what_follows_a_refusal_is_read_for_bounded_seconds_and_bytes(small, monkeypatch) -> None:
    from transformer_xl.serve import connections

    head = _head("POST", "/v1/completions", Content_Type="application/json", Content_Length=str(10 ** 12))
    monkeypatch.setattr(connections, "LINGER_SECONDS", 0.5)
    seconds, _ = _send_until_closed(small.raw(head), b" " * 1024, every=0.02, within=10)  # a trickle, for ever
    assert 0.4 < seconds < 3, seconds
    monkeypatch.setattr(connections, "LINGER_SECONDS", 30.0)
    monkeypatch.setattr(connections, "LINGER_BYTES", 1 << 20)
    seconds, sent = _send_until_closed(small.raw(head), b" " * (1 << 20), every=0, within=10)  # a flood
    assert sent < 48 << 20 and seconds < 5, (sent, seconds)  # 1 MiB read, then what the sockets' buffers hold


def test_a_chunked_body_is_counted_as_it_arrives(small) -> None:
    chunk = b"%x\r\n%s\r\n" % (16 * 1024, b"x" * 16 * 1024)
    sock = small.raw(_head("POST", "/v1/completions", Content_Type="application/json",
                           Transfer_Encoding="chunked") + chunk * 5)  # 80 KiB, and no end: refused all the same
    status, data = read_status(sock, 5)
    assert status == 413, data[:200]


def test_an_unused_field_over_the_limit_is_refused_and_one_under_it_is_not(small) -> None:
    status, doc = small.post("/v1/completions", {**ASK, "unused": "x" * LIMIT})
    assert status == 413 and doc["error"]["code"] == "body_too_large"
    status, doc = small.post("/v1/completions", {**ASK, "unused": "x" * (LIMIT - 100)})
    assert status == 200 and doc["usage"]["completion_tokens"] == 2


def test_a_body_that_does_not_arrive_in_time_gets_408(small) -> None:
    sock = small.raw(_head("POST", "/v1/completions", Content_Type="application/json", Content_Length="100")
                     + b'{"prompt": ')
    start = time.monotonic()
    status, data = read_status(sock, 5)
    assert status == 408 and time.monotonic() - start < 2.5, data[:200]
    assert b"--body-timeout" in data


@pytest.mark.parametrize("content_type, status", [
    (None, 415), ("text/plain", 415), ("application/x-www-form-urlencoded", 415), ("multipart/form-data; b=x", 415),
    ("application/jsonp", 415), ("application/json", 200), ("application/json; charset=utf-8", 200),
    ("Application/JSON ;charset=UTF-8", 200)])
def test_a_post_body_is_taken_only_as_json(small, content_type, status) -> None:
    """What a web page may send to any site without a CORS preflight (a form, text/plain) runs nothing."""
    import json

    headers = {} if content_type is None else {"Content-Type": content_type}
    got, _, doc = small.request("POST", "/v1/completions", json.dumps(ASK).encode(), headers)
    assert got == status, doc
    if status == 415:
        assert doc["error"]["code"] == "unsupported_media_type" and "application/json" in doc["error"]["message"]


@pytest.mark.parametrize("host, status", [
    ("evil.example", 421), ("evil.example:{port}", 421), ("localhost.evil.example", 421), ("127.0.0.1.nip.io", 421),
    ("localhost", 200), ("localhost:{port}", 200), ("LOCALHOST:{port}", 200), ("127.0.0.1:{port}", 200),
    ("[::1]:{port}", 200), ("10.1.2.3:80", 200), ("proxy.example", 200), ("proxy.example:443", 200)])
def test_without_a_key_only_requests_naming_this_server_are_answered(small, host, status) -> None:
    """A page whose name has been pointed at 127.0.0.1 (DNS rebinding) sends its own name as the Host."""
    got, doc = small.post("/v1/completions", ASK, {"Host": host.format(port=small.port)})
    assert got == status, doc
    if status == 421:
        assert doc["error"]["code"] == "invalid_host" and "--allowed-host" in doc["error"]["message"]
    got, _, _ = small.request("GET", "/", headers={"Host": host.format(port=small.port)})
    assert got == status


@pytest.mark.parametrize("origin, status", [
    ("http://evil.example", 403), ("https://evil.example:{port}", 403), ("null", 403), ("file://", 403),
    # a page served from any other address: an IP is no name of this server (the Host check lets IPs through, since
    # no DNS name can be rebound to one; an Origin is a page, which any address can serve)
    ("http://203.0.113.5", 403), ("http://203.0.113.5:{port}", 403), ("http://[2001:db8::1]:{port}", 403),
    ("http://10.0.0.1:{port}", 403),
    ("http://127.0.0.1:{port}", 200), ("http://localhost:3000", 200), ("https://proxy.example", 200),
    ("http://[::1]:8080", 200)])
def test_a_request_from_another_sites_page_is_refused(small, origin, status) -> None:
    got, doc = small.post("/v1/completions", ASK, {"Origin": origin.format(port=small.port)})
    assert got == status, doc
    if status == 403:
        assert doc["error"]["code"] == "cross_origin"


def test_a_page_of_the_address_the_server_is_reached_at_is_its_own_and_no_other_address_is(small) -> None:
    mine = {"Host": "10.1.2.3:8000"}
    assert small.post("/v1/completions", ASK, {**mine, "Origin": "http://10.1.2.3:8000"})[0] == 200
    for origin in ("http://203.0.113.5:8000", "http://10.1.2.3:9000", "http://10.1.2.4:8000"):
        got, doc = small.post("/v1/completions", ASK, {**mine, "Origin": origin})
        assert got == 403 and doc["error"]["code"] == "cross_origin", origin


def test_with_keys_any_key_in_any_case_of_the_scheme_and_no_host_check(keyed) -> None:
    for auth in ("Bearer key-one", "bearer key-two", "BEARER   key-one "):
        got, doc = keyed.post("/v1/completions", ASK, {"Authorization": auth, "Host": "models.example"})
        assert got == 200, (auth, doc)
    for auth in (None, "Bearer key-three", "Basic key-one", "Bearer", "key-one", "Bearer key-one key-two"):
        got, head, doc = keyed.request("GET", "/v1/models", headers={} if auth is None else {"Authorization": auth})
        assert got == 401 and doc["error"]["code"] == "invalid_api_key", auth
        assert head["www-authenticate"] == "Bearer"
    got, doc = keyed.post("/v1/completions", ASK, {"Authorization": "Bearer key-one", "Origin": "http://evil.example"})
    assert got == 403
    for path in ("/", "/health"):  # open without a key
        assert keyed.request("GET", path)[0] == 200
    for path in ("/tokenizer_info", "/v1/tokenizer_info", "/nowhere"):  # everything else wants one
        assert keyed.request("GET", path)[0] == 401


def test_the_helpers() -> None:
    assert [host_name(h) for h in ("A.Example:80", "[::1]:8000", "::1", "127.0.0.1", "[fe80::1]", "localhost.:80",
                                   "proxy.example.")] == [
        "a.example", "::1", "::1", "127.0.0.1", "fe80::1", "localhost", "proxy.example"]
    assert is_json("application/json") and is_json(" application/JSON ; charset=utf-8")
    assert not is_json(None) and not is_json("text/plain") and not is_json("application/json-patch+json")
    guard = KeyGuard(None, ["a", "b"])
    assert [guard.owner(v) for v in ("Bearer a", "bearer b", "Bearer c", None, "Token a")] == [
        "key1", "key2", None, None, None]
