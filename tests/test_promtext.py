"""The targeted parser against prometheus_client's full parser, on every fixture we ship."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.promtext import SampleNames, TextFormatError, parse_samples
from tests.conftest import METRICS

FIXTURES = sorted(p.name for p in METRICS.glob("*.txt"))


def _reference(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    # prometheus_client renames a counter sample that lacks `_total` on the wire (Triton's
    # `nv_inference_count`) to `<name>_total`; the scaler looks names up as they are on the wire.
    on_wire = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if name not in on_wire and name.endswith("_total") and name[: -len("_total")] in on_wire:
                name = name[: -len("_total")]
            out.append((name, tuple(sorted(s.labels.items())), s.value))
    return out


def _clean(text: str) -> str:
    # The vLLM docs example elides lines with "..."; neither parser accepts those.
    return "\n".join(line for line in text.splitlines() if line.strip() != "...") + "\n"


def _key(sample: tuple[str, tuple[tuple[str, str], ...], float]) -> tuple[str, tuple[tuple[str, str], ...], str]:
    name, labels, value = sample
    return name, labels, "nan" if math.isnan(value) else repr(float(value))


@pytest.mark.parametrize("fixture", FIXTURES)
def test_every_sample_matches_prometheus_client(fixture: str) -> None:
    text = _clean((METRICS / fixture).read_text())
    reference = _reference(text)
    assert reference, "fixture has samples"
    ours = parse_samples(text, SampleNames({name for name, _, _ in reference}))
    flat = [(s.name, tuple(sorted(s.labels.items())), s.value) for v in ours.values() for s in v]
    assert sorted(map(_key, flat)) == sorted(map(_key, reference))


@pytest.mark.parametrize("fixture", FIXTURES)
def test_subset_selection_keeps_only_wanted_names(fixture: str) -> None:
    text = _clean((METRICS / fixture).read_text())
    reference = _reference(text)
    wanted = sorted({name for name, _, _ in reference})[::3]
    ours = parse_samples(text, SampleNames(wanted))
    assert set(ours) == set(wanted)
    expected = sorted(_key(s) for s in reference if s[0] in set(wanted))
    flat = [(s.name, tuple(sorted(s.labels.items())), s.value) for v in ours.values() for s in v]
    assert sorted(map(_key, flat)) == expected


def test_escapes_special_values_timestamps_and_odd_spacing() -> None:
    text = (
        "# HELP m a metric\n"
        'm{a="x\\"y",b="line\\nbreak",c="back\\\\slash",d="{}=,"} 1.5 1700000000000\n'
        'm{a="plain"} NaN\n'
        'm{a="inf",} +Inf\n'
        'm{a="neg"} -Inf\n'
        "m   3e+06\n"
        'm_longer{a="skip"} 7\n'
        'other{a="b"} 2\n'
    )
    got = parse_samples(text, SampleNames({"m"}))["m"]
    assert got[0].labels == {"a": 'x"y', "b": "line\nbreak", "c": "back\\slash", "d": "{}=,"}
    assert got[0].value == 1.5
    assert math.isnan(got[1].value)
    assert got[2].labels == {"a": "inf"} and got[2].value == math.inf
    assert got[3].value == -math.inf
    assert got[4].labels == {} and got[4].value == 3e6
    assert len(got) == 5
    assert _reference(text.replace("m_longer", "m_longer")), "prometheus_client accepts the same text"


@pytest.mark.parametrize(
    "line",
    ['m{a="x"', "m{a=x} 1", 'm{a="x"} one', "m", 'm{a="x"} 1 2 3'],
    ids=["unterminated", "unquoted", "bad-value", "no-value", "extra-fields"],
)
def test_malformed_wanted_line_raises(line: str) -> None:
    with pytest.raises(TextFormatError):
        parse_samples(line + "\n", SampleNames({"m"}))


def test_malformed_unwanted_line_is_never_read() -> None:
    text = "garbage{{{ not a line\nm 1\n\x00\x01 binary\n"
    assert parse_samples(text, SampleNames({"m"}))["m"][0].value == 1.0


_LABEL_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_LABEL_VALUES = st.text(alphabet=st.sampled_from([*'ab0 ,{}="\\\n=.', "é", "😀"]), max_size=12)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@given(
    labels=st.dictionaries(_LABEL_NAMES, _LABEL_VALUES, max_size=4),
    spaces=st.sampled_from(["", " "]),
    trailing_comma=st.booleans(),
)
def test_labels_read_as_prometheus_client_reads_them(labels: dict[str, str], spaces: str, trailing_comma: bool) -> None:
    # the plain-label fast path and the careful path must agree with the reference parser on every block
    block = f",{spaces}".join(f'{k}{spaces}={spaces}"{_escape(v)}"' for k, v in labels.items())
    if trailing_comma and labels:
        block += ","
    text = f"# TYPE x gauge\nx{{{block}}} 1.5\n"
    (family,) = text_string_to_metric_families(text)
    (reference,) = family.samples
    ours = parse_samples(text, SampleNames(["x"]))["x"]
    assert [s.labels for s in ours] == [reference.labels] and ours[0].value == reference.value
