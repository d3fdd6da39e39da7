"""MySQL's packed forms of DECIMAL and TIME, as row images and binary JSON's opaque values both hold them.

Layouts of the server's `decimal2bin` (strings/decimal.cc) and `my_time_packed_from_binary` (my_time.cc).
"""

from __future__ import annotations

from collections.abc import Callable

_DIGITS_TO_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a decimal group of 0-9 digits


def decimal_size(precision: int, scale: int) -> int:
    """Bytes of a DECIMAL(precision, scale) in binary form."""
    whole, rest = divmod(precision - scale, 9)
    frac_whole, frac_rest = divmod(scale, 9)
    return whole * 4 + _DIGITS_TO_BYTES[rest] + frac_whole * 4 + _DIGITS_TO_BYTES[frac_rest]


def decimal_reader(precision: int, scale: int) -> Callable[[bytes, int], tuple[str, int]]:
    """MySQL's binary DECIMAL: groups of 9 digits in 4 bytes big-endian, a shorter group first (integer part)
    and last (fraction); the sign in the top bit, negative values stored with every bit inverted. The value
    is read as one integer and its groups taken out with shifts."""
    size = decimal_size(precision, scale)
    int_groups, frac_groups, frac_rest = (precision - scale) // 9, scale // 9, scale % 9
    rest_bits = 8 * _DIGITS_TO_BYTES[frac_rest]
    int_shift = rest_bits + 32 * frac_groups
    frac_shifts = [rest_bits + 32 * k for k in range(frac_groups - 1, -1, -1)]
    int_shifts = [32 * k for k in range(int_groups - 1, -1, -1)]
    sign_bit, every_bit, rest_mask = 1 << (8 * size - 1), (1 << (8 * size)) - 1, (1 << rest_bits) - 1
    from_bytes = int.from_bytes

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        raw = from_bytes(buf[pos : pos + size], "big") ^ sign_bit
        negative = raw & sign_bit  # the stored sign bit was clear
        if negative:
            raw ^= every_bit
        digits = raw >> int_shift
        whole = digits >> (32 * int_groups)
        for shift in int_shifts:
            whole = whole * 1_000_000_000 + (digits >> shift & 0xFFFFFFFF)
        text = f"-{whole}" if negative else str(whole)
        if frac_shifts:
            text += "." + "".join([f"{raw >> shift & 0xFFFFFFFF:09d}" for shift in frac_shifts])
            if frac_rest:
                text += f"{raw & rest_mask:0{frac_rest}d}"
        elif frac_rest:
            text += f".{raw & rest_mask:0{frac_rest}d}"
        return text, pos + size

    return read


def time_text(negative: bool, hms: int, us: int, fsp: int) -> str:
    """TIME as MySQL prints it, from its packed parts (hour << 12 | minute << 6 | second)."""
    text = f"{'-' if negative and (hms or us) else ''}{hms >> 12 & 0x3FF:02d}:{hms >> 6 & 0x3F:02d}:{hms & 0x3F:02d}"
    return text + "." + f"{us:06d}"[:fsp] if fsp else text
