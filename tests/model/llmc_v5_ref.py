"""llmc_v5_ref.py - an independent writer of llm.c's version-5 (bf16) GPT-2 checkpoint
(struct only), for tests/model/test_llmc.c.

    llmc_v5_ref.py PATH L NH C maxT V Vp

The header is train_gpt2.cu's: int32[256] {20240326, 5, maxT, V, L, NH, C, Vp, 0...}, then
every parameter as bf16 in llm.c's order. Element i holds value(i) = k/64 with |k| <= 125:
exact in bf16 (8 significant bits), so the reader's widening must give it back bit for
bit. The parameter count is worked out here from GPT-2's shapes, not taken from weft.
"""
import struct
import sys


def value(i):
    return ((i * 13 + 7) % 251 - 125) / 64.0


def num_params(L, C, T, Vp):
    per_layer = (C + C            # ln1 weight, bias
                 + 3 * C * C + 3 * C  # qkv weight, bias
                 + C * C + C      # attention projection
                 + C + C          # ln2
                 + 4 * C * C + 4 * C  # fc
                 + 4 * C * C + C)     # fc projection
    return Vp * C + T * C + L * per_layer + C + C


def main():
    path = sys.argv[1]
    L, NH, C, T, V, Vp = (int(x) for x in sys.argv[2:8])
    header = [20240326, 5, T, V, L, NH, C, Vp] + [0] * 248
    n = num_params(L, C, T, Vp)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        # bf16 is the top half of the float32 (the values are exact: no rounding)
        f.write(b"".join(struct.pack("<f", value(i))[2:] for i in range(n)))


if __name__ == "__main__":
    main()
