"""Line framing and URL parsing shared by the OCS drivers."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from devices.ocs import Endpoint, OcsConfigError, parse_url
from devices.ocs.lines import LineSplitter

texts = st.lists(st.text(st.characters(blacklist_characters="\r\n", codec="utf-8"), min_size=1, max_size=12)
                 .filter(lambda s: s.strip() == s and s), max_size=8)


@settings(suppress_health_check=[HealthCheck.too_slow])  # generation time is the machine's load, not ours
@given(lines=texts, endings=st.lists(st.sampled_from(["\r", "\n", "\r\n", "\n\n", "\r\n\r\n"]), min_size=8,
                                     max_size=8), cuts=st.lists(st.integers(0, 200), max_size=10))
def test_splitter_is_independent_of_line_ends_and_chunking(lines, endings, cuts):
    data = "".join(line + end for line, end in zip(lines, endings)).encode()
    splitter = LineSplitter()
    out: list[str] = []
    bounds = sorted({0, len(data), *[c % (len(data) + 1) for c in cuts]})
    for a, b in zip(bounds, bounds[1:]):
        out += splitter.feed(data[a:b])
    assert out == lines
    assert splitter.pending == ""


def test_splitter_keeps_a_prompt_until_the_next_line():
    splitter = LineSplitter()
    assert splitter.feed(b";\n<") == [";"]
    assert splitter.pending == "<"
    assert splitter.feed(b"   SID 24-05-01 12:00:00\n") == ["<   SID 24-05-01 12:00:00"]


@pytest.mark.parametrize("url, protocol, expected", [
    ("tcp://127.0.0.1:3082", "polatis-tl1", Endpoint("tcp", "127.0.0.1", 3082)),
    ("tcp://127.0.0.1", "polatis-tl1", Endpoint("tcp", "127.0.0.1", 3082)),
    ("tcp://127.0.0.1", "polatis-scpi", Endpoint("tcp", "127.0.0.1", 5025)),
    ("tcp://[::1]:5025", "polatis-scpi", Endpoint("tcp", "::1", 5025)),
    ("socket://127.0.0.1:5025", "polatis-scpi", Endpoint("serial", url="socket://127.0.0.1:5025")),
    ("rfc2217://127.0.0.1:7000", "polatis-scpi", Endpoint("serial", url="rfc2217://127.0.0.1:7000")),
    ("/dev/ttyUSB0", "polatis-scpi", Endpoint("serial", url="/dev/ttyUSB0")),
])
def test_parse_url_accepts(url, protocol, expected):
    assert parse_url(url, protocol) == expected


@pytest.mark.parametrize("url, protocol", [
    ("", "polatis-tl1"), ("tcp://:3082", "polatis-tl1"), ("tcp://h:0", "polatis-tl1"),
    ("http://h", "polatis-scpi"), ("socket://h:1", "polatis-tl1"), ("ttyUSB0", "polatis-scpi"),
    ("tcp://h:1", "calient-tl1"),
])
def test_parse_url_rejects(url, protocol):
    with pytest.raises(OcsConfigError):
        parse_url(url, protocol)
