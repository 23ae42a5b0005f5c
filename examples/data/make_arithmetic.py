"""Write arithmetic.txt next to this file: small sums and products, spelled out in words.

    python examples/data/make_arithmetic.py

The text is generated, not copied from anywhere; the output is the same byte for byte on
every run, so the bundled file can always be checked against this script.
"""

from __future__ import annotations

from pathlib import Path

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def words(k: int) -> str:
    """0 <= k < 1000 in English words: 144 -> 'one hundred forty-four'."""
    if k < 20:
        return ONES[k]
    if k < 100:
        return TENS[k // 10] + ("-" + ONES[k % 10] if k % 10 else "")
    return ONES[k // 100] + " hundred" + (" " + words(k % 100) if k % 100 else "")


def sentences() -> list[str]:
    out = [f"{words(a)} plus {words(b)} is {words(a + b)}."
           for a in range(21) for b in range(21)]
    out += [f"{words(a)} times {words(b)} is {words(a * b)}."
            for a in range(2, 13) for b in range(2, 13)]
    return out


def main() -> None:
    target = Path(__file__).resolve().parent / "arithmetic.txt"
    target.write_text("\n".join(sentences()) + "\n", encoding="ascii")
    print(f"wrote {target} ({target.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
