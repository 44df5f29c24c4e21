"""Cost of one multiply-add of a matrix product by weight type, relative to Q8_0
(ggmlrpc.compute.work). Written by bench/calibrate_work.py on one host
(x86_64, kernel family x86-avx512-fp16); do not edit by hand."""

WEIGHTS = {
    'F32': 3.1,
    'F16': 2.2,
    'Q4_0': 1.0,
    'Q4_1': 1.3,
    'Q5_0': 1.3,
    'Q5_1': 1.6,
    'Q8_0': 1.0,
    'Q2_K': 1.1,
    'Q3_K': 1.2,
    'Q4_K': 1.0,
    'Q5_K': 1.3,
    'Q6_K': 1.2,
    'IQ2_XXS': 123.8,
    'IQ2_XS': 146.6,
    'IQ3_XXS': 163.6,
    'IQ1_S': 42.4,
    'IQ4_NL': 1.1,
    'IQ3_S': 141.9,
    'IQ2_S': 117.5,
    'IQ4_XS': 1.0,
    'IQ1_M': 45.4,
    'BF16': 2.3,
    'TQ1_0': 11.1,
    'TQ2_0': 6.1,
    'MXFP4': 2.5,
    'NVFP4': 22.6,
    'Q1_0': 47.5,
    'Q2_0': 39.9,
}
