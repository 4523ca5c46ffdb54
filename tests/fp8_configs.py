"""gemm_fp8's plain fast-accumulation configuration (128 x 256, 4 stages, two consumers, TMA-
stored epilogue), written out so the fp8 tests do not move when the template's value order
does; the tests vary it one parameter at a time."""
BASE = dict(BM=128, BN=256, STAGES=4, CONSUMERS=2, GROUP_M=16, CLUSTER=1, EPI=3, STREAMK=0,
            PROMOTE=0, ORDERED=0, EARLY_SCALES=0, PINGPONG=0, PSETS=1, PSPLIT=1)
