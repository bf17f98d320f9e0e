"""Qualified device names (§5) and CDI annotations (§4), checked against the reference.

Expected behaviour and error texts are those of the CNCF CDI library (pkg/parser/parser.go,
pkg/parser/parser_test.go, pkg/cdi/annotations.go and annotations_test.go) as summarised in
shared/reference/cdi-semantics.md §4, §5 and §6.3/§6.4. Go formats names with %q, so a quote
in a name comes out escaped.
"""
import copy
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi.annotations import annotation_key, annotation_value, parse_annotations, update_annotations
from cdi.errors import CDIError, NameError_
from cdi.parser import (check_device_argument, is_qualified_name, parse_device, parse_qualified_name,
                        validate_class_name, validate_device_name, validate_vendor_name)

PREFIX = "cdi.k8s.io/"


# --- parser_test.go TestQualifiedName ------------------------------------------------------

VALID = [
    ("vendor.com/class=dev", "vendor.com", "class", "dev"),
    ("a/b=c", "a", "b", "c"),  # single-character vendor and class: panicked before the fix
    ("aa/b=cc", "aa", "b", "cc"),
    ("a/bb=cc", "a", "bb", "cc"),
    ("vendor.com/class=0", "vendor.com", "class", "0"),
    ("vendor1.com/class1=dev1", "vendor1.com", "class1", "dev1"),
    ("vendor1.com/class.subclass=dev1", "vendor1.com", "class.subclass", "dev1"),
    ("other-vendor1.com/class_1=dev_1", "other-vendor1.com", "class_1", "dev_1"),
    ("yet_another-vendor2.com/c-lass_2=dev_1:2.3", "yet_another-vendor2.com", "c-lass_2", "dev_1:2.3"),
    # no lowercase/DNS/length checks in the library
    ("VENDOR_x.COM/Class=Dev", "VENDOR_x.COM", "Class", "Dev"),
    ("nvidia.com/gpu=GPU-6a1b2c3d-0000-1111-2222-333344445555", "nvidia.com", "gpu",
     "GPU-6a1b2c3d-0000-1111-2222-333344445555"),
    ("v" * 300 + ".com/" + "c" * 100 + "=" + "n" * 100, "v" * 300 + ".com", "c" * 100, "n" * 100),
]


@pytest.mark.parametrize("device, vendor, cls, name", VALID)
def test_valid_qualified_names(device, vendor, cls, name):
    assert is_qualified_name(device)
    assert parse_qualified_name(device) == (vendor, cls, name)
    assert parse_device(device) == (vendor, cls, name)
    assert f"{vendor}/{cls}={name}" == device
    assert check_device_argument(device) == (vendor, cls, name)


INVALID = [
    ("_invalid.com/class=dev", ("_invalid.com", "class", "dev"),
     'invalid device "_invalid.com/class=dev": invalid vendor. "_invalid.com", should start with letter'),
    ("invalid2.com-/class=dev", ("invalid2.com-", "class", "dev"),
     'invalid device "invalid2.com-/class=dev": invalid vendor. "invalid2.com-", should end with a letter or digit'),
    ("invalid3.com/_class=dev", ("invalid3.com", "_class", "dev"),
     'invalid device "invalid3.com/_class=dev": invalid class. "_class", should start with letter'),
    ("invalid4.com/class_=dev", ("invalid4.com", "class_", "dev"),
     'invalid device "invalid4.com/class_=dev": invalid class. "class_", should end with a letter or digit'),
    ("invalid5.com/class=-dev", ("invalid5.com", "class", "-dev"),
     'invalid device "invalid5.com/class=-dev": invalid class "-dev", should start with a letter or digit'),
    ("invalid6.com/class=dev:", ("invalid6.com", "class", "dev:"),
     'invalid device "invalid6.com/class=dev:": invalid name "dev:", should end with a letter or digit'),
    ("*.com/*dev=*gpu*", ("*.com", "*dev", "*gpu*"),
     'invalid device "*.com/*dev=*gpu*": invalid vendor. "*.com", should start with letter'),
    # beyond parser_test.go, same rules
    ("1vendor.com/class=dev", ("1vendor.com", "class", "dev"),
     'invalid device "1vendor.com/class=dev": invalid vendor. "1vendor.com", should start with letter'),
    ("vendor.com/cl@ss=dev", ("vendor.com", "cl@ss", "dev"),
     "invalid device \"vendor.com/cl@ss=dev\": invalid class. invalid character '@' in name \"cl@ss\""),
    ("vendor.com/foo/bar=dev", ("vendor.com", "foo/bar", "dev"),
     "invalid device \"vendor.com/foo/bar=dev\": invalid class. invalid character '/' in name \"foo/bar\""),
    ("vendor.com/class=a/b", ("vendor.com", "class", "a/b"),
     "invalid device \"vendor.com/class=a/b\": invalid character '/' in device name \"a/b\""),
    ("vendor.com/class=a=b", ("vendor.com", "class", "a=b"),
     "invalid device \"vendor.com/class=a=b\": invalid character '=' in device name \"a=b\""),
    ("vendor.com/class=dev ice", ("vendor.com", "class", "dev ice"),
     "invalid device \"vendor.com/class=dev ice\": invalid character ' ' in device name \"dev ice\""),
    ("_/b=c", ("_", "b", "c"), 'invalid device "_/b=c": invalid vendor. "_", should start with letter'),
    ("a/1=c", ("a", "1", "c"), 'invalid device "a/1=c": invalid class. "1", should start with letter'),
    ("a/b=-", ("a", "b", "-"), 'invalid device "a/b=-": invalid class "-", should start with a letter or digit'),
    ("vend\u00f6r.com/class=dev", ("vend\u00f6r.com", "class", "dev"),
     "invalid device \"vend\u00f6r.com/class=dev\": invalid vendor. "
     "invalid character '\u00f6' in name \"vend\u00f6r.com\""),
]


@pytest.mark.parametrize("device, parts, message", INVALID)
def test_invalid_qualified_names(device, parts, message):
    assert not is_qualified_name(device)
    assert parse_device(device) == parts  # parsable, just not valid
    with pytest.raises(NameError_) as info:
        parse_qualified_name(device)
    assert str(info.value) == message


UNQUALIFIED = ["", "/dev/null", "/vendor.com/class=dev", "vendor.com/class", "vendor.com=dev", "=dev",
               "vendor.com/class=", "vendor.com/=dev", "/=dev", "dev", "nvidia.com/gpu"]


@pytest.mark.parametrize("device", UNQUALIFIED)
def test_unqualified_names_missing_vendor(device):
    # ParseDevice returns ("", "", device) for all of these, so the vendor is what is "missing"
    assert parse_device(device) == ("", "", device)
    assert not is_qualified_name(device)
    with pytest.raises(NameError_) as info:
        parse_qualified_name(device)
    assert str(info.value) == f'unqualified device "{device}", missing vendor'


def test_parse_device_splits_at_first_equals_and_first_slash():
    assert parse_device("a/b/c=d=e") == ("a", "b/c", "d=e")


@pytest.mark.parametrize("device, message", [
    # Go %q escapes quotes, backslashes and control characters
    ('vendor.com/class=de"v', 'invalid device "vendor.com/class=de\\"v": '
                              'invalid character \'"\' in device name "de\\"v"'),
    ("foo\nbar", 'unqualified device "foo\\nbar", missing vendor'),
    ("a\\b/c=d", 'invalid device "a\\\\b/c=d": invalid vendor. invalid character \'\\\' in name "a\\\\b"'),
])
def test_error_texts_quote_like_go(device, message):
    with pytest.raises(NameError_) as info:
        parse_qualified_name(device)
    assert str(info.value) == message


def test_non_ascii_last_character_reported_like_go_byte_slicing():
    # Go checks name[1:len(name)-1] as a byte slice: the last rune "é" is cut in half and its first
    # byte decodes as U+FFFD, reported as an invalid inner character.
    with pytest.raises(NameError_) as info:
        parse_qualified_name("vendor.com/class=d\u00e9")
    assert str(info.value) == ("invalid device \"vendor.com/class=d\u00e9\": "
                               "invalid character '\ufffd' in device name \"d\u00e9\"")


@pytest.mark.parametrize("device", ["vendor.com/class=d\u00e9v", "v\u00e9.com/c=d", "\u00e9/b=c", "a/b=\u0661",
                                    "a/b=\uff41", "\u212a/b=c"])
def test_non_ascii_never_valid(device):
    assert not is_qualified_name(device)


def test_validate_part_functions():
    with pytest.raises(NameError_, match=r"^invalid vendor\. empty name$"):
        validate_vendor_name("")
    with pytest.raises(NameError_, match=r"^invalid class\. empty name$"):
        validate_class_name("")
    with pytest.raises(NameError_, match=r"^invalid \(empty\) device name$"):
        validate_device_name("")
    with pytest.raises(NameError_) as info:
        validate_vendor_name("vendor.com-")
    assert str(info.value) == 'invalid vendor. "vendor.com-", should end with a letter or digit'
    with pytest.raises(NameError_) as info:
        validate_class_name("device=")
    assert str(info.value) == 'invalid class. "device=", should end with a letter or digit'
    with pytest.raises(NameError_) as info:
        validate_device_name("a dev ice")
    assert str(info.value) == "invalid character ' ' in device name \"a dev ice\""
    for good in ("a", "Z", "a.b-c_d9"):
        validate_vendor_name(good)
        validate_class_name(good)
    for good in ("0", "a", "9:1", "a:b.c-d_e"):
        validate_device_name(good)


def test_check_device_argument_keeps_reference_reason():
    with pytest.raises(NameError_) as info:
        check_device_argument("invalid5.com/class=-dev")
    assert str(info.value).startswith(
        'invalid device "invalid5.com/class=-dev": invalid class "-dev", should start with a letter or digit')
    with pytest.raises(NameError_) as info:
        check_device_argument("gpu0")
    assert str(info.value).startswith('unqualified device "gpu0", missing vendor')


# --- hypothesis ---------------------------------------------------------------------------

_LETTER = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ALNUM = _LETTER + "0123456789"


def _part(first, inner, last):
    return st.one_of(
        st.sampled_from(first),
        st.builds(lambda a, b, c: a + b + c, st.sampled_from(first), st.text(inner, max_size=12),
                  st.sampled_from(last)))


VENDOR_OR_CLASS = _part(_LETTER, _ALNUM + "_.-", _ALNUM)
DEVICE_NAME = _part(_ALNUM, _ALNUM + "_.:-", _ALNUM)

# An oracle for the reference rules (ASCII only: any other character is invalid).
_QUALIFIED_RE = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
                           r"/[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
                           r"=[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


@settings(max_examples=500, deadline=None)
@given(VENDOR_OR_CLASS, VENDOR_OR_CLASS, DEVICE_NAME)
def test_property_valid_names_round_trip(vendor, cls, name):
    device = f"{vendor}/{cls}={name}"
    assert parse_qualified_name(device) == (vendor, cls, name)
    assert parse_device(device) == (vendor, cls, name)
    assert is_qualified_name(device)
    validate_vendor_name(vendor)
    validate_class_name(cls)
    validate_device_name(name)


_TRICKY = st.text(alphabet=st.sampled_from(list("aZ09_.-:/=@ \"\\\n") + ["\u00e9", "\u0661", "\U0001F600"]),
                  max_size=14)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.text(max_size=20), _TRICKY))
def test_property_arbitrary_text_only_raises_name_error(text):
    try:
        vendor, cls, name = parse_qualified_name(text)
    except NameError_:
        assert not is_qualified_name(text)
        assert _QUALIFIED_RE.fullmatch(text) is None
    else:
        assert f"{vendor}/{cls}={name}" == text
        assert is_qualified_name(text)
        assert _QUALIFIED_RE.fullmatch(text) is not None
    parts = parse_device(text)
    assert isinstance(parts, tuple) and len(parts) == 3
    if parts[0]:
        assert f"{parts[0]}/{parts[1]}={parts[2]}" == text
    else:
        assert parts == ("", "", text)
    for check in (validate_vendor_name, validate_class_name, validate_device_name, check_device_argument):
        try:
            check(text)
        except NameError_:
            pass


# --- annotations (§4, annotations_test.go) ------------------------------------------------

@pytest.mark.parametrize("plugin, dev_id, message", [
    ("", "device", "invalid plugin name, empty"),
    ("plugin", "", "invalid deviceID, empty"),
    ("_vendor.class", "device", "invalid name \"_vendor.class_device\", first '_' should be alphanumeric"),
    ("vendor.class", "device_", "invalid name \"vendor.class_device_\", last '_' should be alphanumeric"),
    ("ven.dor-cl+ass", "device", "invalid name \"ven.dor-cl+ass_device\", invalid character '+'"),
    ("vendor.class", "dev+ice", "invalid name \"vendor.class_dev+ice\", invalid character '+'"),
    ("123456789012345678901234567890123456789012345678901234567", "device",
     'invalid plugin+deviceID "123456789012345678901234567890123456789012345678901234567_device", too long'),
])
def test_annotation_key_invalid(plugin, dev_id, message):
    with pytest.raises(CDIError) as info:
        annotation_key(plugin, dev_id)
    assert str(info.value) == message


@pytest.mark.parametrize("plugin, dev_id, key", [
    ("vendor.class", "device", PREFIX + "vendor.class_device"),
    ("v-e.n_d.or.cl-as_s", "d_e-v-i-c_e", PREFIX + "v-e.n_d.or.cl-as_s_d_e-v-i-c_e"),
    ("v-e.n_d.or.cl-as_s", "d-e/v/i/c-e", PREFIX + "v-e.n_d.or.cl-as_s_d-e_v_i_c-e"),
    ("1" * 56, "device", PREFIX + "1" * 56 + "_device"),  # exactly 63
    ("p", "0", PREFIX + "p_0"),
])
def test_annotation_key_valid(plugin, dev_id, key):
    assert annotation_key(plugin, dev_id) == key


def test_annotation_key_length_checked_before_characters():
    with pytest.raises(CDIError) as info:
        annotation_key("+" * 60, "device")
    assert str(info.value) == f'invalid plugin+deviceID "{"+" * 60}_device", too long'


def test_annotation_value():
    assert annotation_value([]) == ""
    assert annotation_value(["vendor.com/class=device"]) == "vendor.com/class=device"
    assert annotation_value(["a/b=c", "vendor.com/class=0"]) == "a/b=c,vendor.com/class=0"


@pytest.mark.parametrize("devices", [["vendor.com/class=dev", "vendor.com/device2"], ["/dev/null"], [""],
                                     ["vendor.com/class=dev", "invalid5.com/class=-dev"]])
def test_annotation_value_invalid(devices):
    with pytest.raises(CDIError):
        annotation_value(devices)


@pytest.mark.parametrize("devices, message", [
    (["vendor.com/class=dev", "vendor.com/device2"], 'unqualified device "vendor.com/device2", missing vendor'),
    (["/dev/null"], 'unqualified device "/dev/null", missing vendor'),
    (["invalid5.com/class=-dev"],
     'invalid device "invalid5.com/class=-dev": invalid class "-dev", should start with a letter or digit'),
])
def test_annotation_value_error_is_the_parser_error(devices, message):
    # annotations.Value returns ParseQualifiedName's error unchanged
    with pytest.raises(CDIError) as info:
        annotation_value(devices)
    assert str(info.value) == message


def _update_all(annotations, injections):
    for plugin, dev_id, devices in injections:
        annotations = update_annotations(annotations, plugin, dev_id, devices)
    return annotations


def test_update_annotations_one_plugin_one_device():
    result = _update_all(None, [("vendor.class", "device", ["vendor.com/class=device"])])
    assert result == {PREFIX + "vendor.class_device": "vendor.com/class=device"}
    keys, devices = parse_annotations(result)
    assert keys == [PREFIX + "vendor.class_device"] and devices == ["vendor.com/class=device"]


def test_update_annotations_one_plugin_multiple_devices():
    devs = ["vendor.com/class=device1", "vendor.com/class=device2", "vendor.com/class=device3"]
    result = _update_all({}, [("vendor.class", "device", devs)])
    assert result == {PREFIX + "vendor.class_device": ",".join(devs)}
    assert parse_annotations(result)[1] == devs


def test_update_annotations_multiple_plugins_multiple_devices():
    result = _update_all(None, [
        ("vendor1.class", "device1", ["vendor1.com/class=device1"]),
        ("vendor1.class", "device2", ["vendor2.com/class=device1", "vendor2.com/class=device2"]),
        ("vendor3.class2", "device", ["vendor3.com/class2=device1", "vendor3.com/class2=device2",
                                      "vendor3.com/class2=device3"]),
    ])
    assert result == {
        PREFIX + "vendor1.class_device1": "vendor1.com/class=device1",
        PREFIX + "vendor1.class_device2": "vendor2.com/class=device1,vendor2.com/class=device2",
        PREFIX + "vendor3.class2_device": ("vendor3.com/class2=device1,vendor3.com/class2=device2,"
                                           "vendor3.com/class2=device3"),
    }
    assert sorted(parse_annotations(result)[1]) == sorted([
        "vendor1.com/class=device1", "vendor2.com/class=device1", "vendor2.com/class=device2",
        "vendor3.com/class2=device1", "vendor3.com/class2=device2", "vendor3.com/class2=device3"])


def test_update_annotations_keeps_unrelated_annotations_and_input():
    existing = {"io.kubernetes.cri.sandbox-id": "abc", PREFIX + "other_dev": "a/b=c"}
    snapshot = copy.deepcopy(existing)
    result = update_annotations(existing, "vendor.class", "device", ["vendor.com/class=device"])
    assert result == dict(snapshot, **{PREFIX + "vendor.class_device": "vendor.com/class=device"})
    assert existing == snapshot


@pytest.mark.parametrize("plugin, dev_id, devices", [
    ("", "device", ["vendor3.com/class2=device1"]),  # "invalid, empty plugin"
    ("vendor2.class", "device", ["vendor2.com/class=device1", "vendor2.com/device2"]),  # malformed reference
    ("vendor3.class2", "device", ["vendor3.com/class2=device1", "/dev/null"]),  # "pre-resolved device"
    ("vendor3.class2", "device", ["vendor3.com/class2=device1"]),  # conflicting key
])
def test_update_annotations_invalid_leaves_input_untouched(plugin, dev_id, devices):
    existing = {PREFIX + "vendor3.class2_device": "vendor3.com/class2=device0", "other": "x"}
    snapshot = copy.deepcopy(existing)
    with pytest.raises(CDIError):
        update_annotations(existing, plugin, dev_id, devices)
    assert existing == snapshot


def test_update_annotations_conflicting_key_message():
    existing = {PREFIX + "vendor3.class2_device": "vendor3.com/class2=device0"}
    with pytest.raises(CDIError) as info:
        update_annotations(existing, "vendor3.class2", "device", ["vendor3.com/class2=device1"])
    assert str(info.value) == 'CDI annotation failed, key "cdi.k8s.io/vendor3.class2_device" used'


def test_update_annotations_key_conflict_checked_before_devices():
    # Update: Key() -> "key used" check -> Value(); a used key wins over bad devices
    existing = {PREFIX + "vendor3.class2_device": "vendor3.com/class2=device0"}
    with pytest.raises(CDIError) as info:
        update_annotations(existing, "vendor3.class2", "device", ["/dev/null"])
    assert str(info.value) == 'CDI annotation failed, key "cdi.k8s.io/vendor3.class2_device" used'


@pytest.mark.parametrize("plugin, dev_id, devices, message", [
    ("", "device", ["a/b=c"], "CDI annotation failed: invalid plugin name, empty"),
    ("vendor.class", "dev+ice", ["a/b=c"],
     "CDI annotation failed: invalid name \"vendor.class_dev+ice\", invalid character '+'"),
    ("vendor.class", "device", ["a/b=c", "/dev/null"],
     'CDI annotation failed: unqualified device "/dev/null", missing vendor'),
])
def test_update_annotations_error_texts(plugin, dev_id, devices, message):
    with pytest.raises(CDIError) as info:
        update_annotations({}, plugin, dev_id, devices)
    assert str(info.value) == message


# TestParseAnnotation
@pytest.mark.parametrize("annotations, devices", [
    ({PREFIX + "vendor.class_device": "vendor.com/class=device1"}, ["vendor.com/class=device1"]),
    ({PREFIX + "vendor.class_device": "vendor.com/class=device1,vendor.com/class=device2,vendor.com/class=device3"},
     ["vendor.com/class=device1", "vendor.com/class=device2", "vendor.com/class=device3"]),
    ({PREFIX + "vendor1.class_device": "vendor1.com/class=device1",
      PREFIX + "vendor2.class_device": "vendor2.com/class=device1,vendor2.com/class=device2",
      PREFIX + "vendor3.class2_device": ("vendor3.com/class2=device1,vendor3.com/class2=device2,"
                                         "vendor3.com/class2=device3")},
     ["vendor1.com/class=device1", "vendor2.com/class=device1", "vendor2.com/class=device2",
      "vendor3.com/class2=device1", "vendor3.com/class2=device2", "vendor3.com/class2=device3"]),
])
def test_parse_annotations_valid(annotations, devices):
    keys, parsed = parse_annotations(annotations)
    assert sorted(parsed) == sorted(devices)
    assert sorted(keys) == sorted(annotations)


def test_parse_annotations_order_within_one_value_kept():
    _, parsed = parse_annotations({PREFIX + "p_d": "z.com/c=3,a.com/c=1,m.com/c=2"})
    assert parsed == ["z.com/c=3", "a.com/c=1", "m.com/c=2"]


def test_parse_annotations_ignores_keys_without_prefix():
    annotations = {"io.kubernetes.cri.container-type": "container", "CDI.k8s.io/x_y": "not a device",
                   "cdi.k8s.io": "also not", PREFIX + "p_d": "a/b=c"}
    assert parse_annotations(annotations) == ([PREFIX + "p_d"], ["a/b=c"])


def test_parse_annotations_empty():
    assert parse_annotations({}) == ([], [])
    assert parse_annotations(None) == ([], [])


@pytest.mark.parametrize("annotations, bad", [
    ({PREFIX + "vendor1.class1_device": "vendor1.com/class1=device1",
      PREFIX + "vendor2.class2_device": "vendor2.com/class2=device2",
      PREFIX + "vendor3.class_device": "vendor3.com=device3"}, "vendor3.com=device3"),
    ({PREFIX + "vendor1.class2_device": "vendor1.com/class2=device1,vendor1.com/class2=device2",
      PREFIX + "vendor2.class_device": "/dev/null"}, "/dev/null"),
    ({PREFIX + "p_d": "a/b=c, a/b=d"}, " a/b=d"),  # no whitespace trimming
    ({PREFIX + "p_d": "a/b=c,"}, ""),  # empty items are errors
    ({PREFIX + "p_d": ""}, ""),
    ({PREFIX + "p_d": 'a/b=c,x"y'}, 'x\\"y'),
])
def test_parse_annotations_invalid(annotations, bad):
    with pytest.raises(CDIError) as info:
        parse_annotations(annotations)
    assert str(info.value) == f'invalid CDI device name "{bad}"'
