"""Scheduling rules of vLLM 0.19.0's v1 scheduler, as our VllmScheduler must follow them.

Each case is a small scenario (conformance/vllm_scenario.py) and the per-step record that vLLM's
own Scheduler / AsyncScheduler produced for it, taken with the vLLM oracle
(`python -m conformance.vllm_main --scenario FILE`, conformance/vllm_oracle.py) and kept here,
so that these run without vLLM. A record: [(rid, tokens scheduled)...], preempted (in order),
finished since the previous step, free blocks (cached-but-unreferenced included), prefix-cache
tokens of the requests admitted that step, running, waiting.

The eviction cases are where the core once differed (a radix tree in place of vLLM's block
pool): the oracle found them, and they stay as its record.
"""

from __future__ import annotations

import json

from conformance.vllm_ours import run_ours
from conformance.vllm_scenario import VllmScenario

# name: (scenario JSON, vLLM's steps, vLLM's output tokens per request)
GOLDEN = {
    "preempt-chunk": (
        '{"name":"preempt-chunk","kv_tokens":32,"context_len":32,"block_size":4,"max_num_seqs":4,"max_num_batched_tokens":8,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"a","arrival_step":0,"prompt":[100,101,102,103,104,105,106,107,108,109],"max_new_tokens":12,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"b","arrival_step":0,"prompt":[100,101,102,103,104,105,7,8],"max_new_tokens":10,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"c","arrival_step":1,"prompt":[300,301,302,303,304,305,306,307,308],"max_new_tokens":6,"ignore_eos":false,"eos_at":3,"priority":0}]}',
        '[[[["a",8]],[],[],6,0,1,1],[[["a",2],["b",4],["c",2]],[],[],3,4,3,0],[[["a",1],["b",1],["c",6]],[],[],1,0,3,0],[[["a",1],["b",1],["c",1]],[],[],0,0,3,0],[[["a",1],["b",1]],["c"],[],2,0,2,1],[[["a",1],["b",1]],[],[],2,0,2,1],[[["a",1],["b",1]],[],[],1,0,2,1],[[["a",1],["b",1]],[],[],1,0,2,1],[[["a",1],["b",1]],[],[],0,0,2,1],[[["a",1],["b",1]],[],[],0,0,2,1],[[["a",1]],["b"],[],3,0,1,2],[[["a",1]],[],[],3,0,1,2],[[["a",1]],[],[],2,0,1,2],[[["b",5],["c",3]],[],["a"],2,12,2,0],[[["c",7]],[],["b"],5,0,1,0],[[["c",1]],[],[],5,0,1,0],[[["c",1]],[],[],5,0,1,0]]',
        '{"a": 12, "b": 10, "c": 4}',
    ),
    "preempt-chunk-async": (
        '{"name":"preempt-chunk-async","kv_tokens":32,"context_len":32,"block_size":4,"max_num_seqs":4,"max_num_batched_tokens":8,"enable_prefix_caching":true,"policy":"priority","async_scheduling":true,"requests":[{"rid":"a","arrival_step":0,"prompt":[100,101,102,103,104,105,106,107,108,109],"max_new_tokens":12,"ignore_eos":true,"eos_at":null,"priority":1},{"rid":"b","arrival_step":0,"prompt":[100,101,102,103,104,105,7,8],"max_new_tokens":10,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"c","arrival_step":1,"prompt":[300,301,302,303,304,305,306,307,308],"max_new_tokens":6,"ignore_eos":false,"eos_at":3,"priority":2}]}',
        '[[[["b",8]],[],[],6,0,1,1],[[["b",1],["a",6],["c",1]],[],[],2,4,3,0],[[["b",1],["a",1],["c",6]],[],[],1,0,3,0],[[["b",1],["a",1],["c",2]],[],[],0,0,3,0],[[["b",1],["a",1]],["c"],[],2,0,2,1],[[["b",1],["a",1]],[],[],1,0,2,1],[[["b",1],["a",1]],[],[],1,0,2,1],[[["b",1],["a",1]],[],[],1,0,2,1],[[["b",1],["a",1]],[],[],0,0,2,1],[[["b",1]],["a"],[],3,0,1,2],[[["a",2],["c",6]],[],["b"],1,16,2,0],[[["a",1],["c",4]],[],[],0,0,2,0],[[["a",1],["c",1]],[],[],0,0,2,0],[[["a",1]],["c"],[],2,0,1,1],[[["c",4]],[],["a"],5,8,1,0],[[["c",1]],[],[],4,0,1,0]]',
        '{"a": 12, "b": 10, "c": 4}',
    ),
    "async-eos-double-free": (
        '{"name":"async-eos-double-free","kv_tokens":16,"context_len":64,"block_size":1,"max_num_seqs":8,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":true,"requests":[{"rid":"r0","arrival_step":0,"prompt":[11,12,13],"max_new_tokens":2,"ignore_eos":false,"eos_at":0,"priority":0}]}',
        '[[[["r0",3]],[],[],13,0,1,0],[[["r0",1]],[],[],12,0,1,0]]',
        '{"r0": 1}',
    ),
    "async-eos-stop-token-cached": (
        '{"name":"async-eos-stop-token-cached","kv_tokens":32,"context_len":64,"block_size":1,"max_num_seqs":8,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":true,"requests":[{"rid":"r0","arrival_step":0,"prompt":[11,12,13],"max_new_tokens":2,"ignore_eos":false,"eos_at":0,"priority":0},{"rid":"r1","arrival_step":5,"prompt":[11,12,13,2,14,15],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0}]}',
        '[[[["r0",3]],[],[],29,0,1,0],[[["r0",1]],[],[],28,0,1,0],[[["r1",3]],[],["r0"],26,3,1,0]]',
        '{"r0": 1, "r1": 1}',
    ),
    "duplicate-block-stops-caching": (
        '{"name":"duplicate-block-stops-caching","kv_tokens":64,"context_len":64,"block_size":4,"max_num_seqs":4,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"r0","arrival_step":0,"prompt":[100,101,102,103,104,105,106],"max_new_tokens":12,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r1","arrival_step":1,"prompt":[100,101,102,103,104,105,106,3510,3517,3524,3531,3538],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r2","arrival_step":11,"prompt":[100,101,102,103,104,105,106,3510,3517,3524,3531,3538,3545,3552,3559,3566,3573],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0}]}',
        '[[[["r0",7]],[],[],14,0,1,0],[[["r0",1],["r1",4]],[],[],13,8,2,0],[[["r0",1]],[],["r1"],13,0,1,0],[[["r0",1]],[],[],13,0,1,0],[[["r0",1]],[],[],13,0,1,0],[[["r0",1]],[],[],13,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],11,0,1,0],[[["r0",1],["r2",1]],[],[],9,16,2,0]]',
        '{"r0": 12, "r1": 1, "r2": 1}',
    ),
    "eviction-order": (
        '{"name":"eviction-order","kv_tokens":32,"context_len":64,"block_size":4,"max_num_seqs":8,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"r0","arrival_step":0,"prompt":[100,101,102,103,104,105,106,107],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r1","arrival_step":2,"prompt":[200,201,202,203,204,205,206,207,208,209,210,211,212,213,214,215,216,217,218,219,220],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r2","arrival_step":4,"prompt":[300,301,302,303],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r3","arrival_step":6,"prompt":[100,101,102,103,104,105,106,107,9],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0}]}',
        '[[[["r0",8]],[],[],6,0,1,0],[[["r1",21]],[],["r0"],2,0,1,0],[[["r2",4]],[],["r1"],7,0,1,0],[[["r3",5]],[],["r2"],5,4,1,0]]',
        '{"r0": 1, "r1": 1, "r2": 1, "r3": 1}',
    ),
    "eviction-whole-leaf-after-preemption": (
        '{"name":"eviction-whole-leaf-after-preemption","kv_tokens":64,"context_len":32768,"block_size":16,"max_num_seqs":4,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"r0","arrival_step":1,"prompt":[7868],"max_new_tokens":17,"ignore_eos":true,"eos_at":null,"priority":1},{"rid":"r2","arrival_step":13,"prompt":[18741,9729,13869,6749,11422,26692,884,27038,29175,26422,6712,3429,8683,21266,25331,5648,20373,28673,12332,13318,27394,16486,5704,894,15782,6869,7041,2731,12313,19755,7308,14664,9233,9024,22233,20278,7937,16495,17882,4442,11970,29103,18695,20763,15452,28645,1280,24493],"max_new_tokens":2,"ignore_eos":true,"eos_at":null,"priority":1}]}',
        '[[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1],["r2",48]],[],[],0,0,2,0],[[["r0",1]],["r2"],[],3,0,1,1],[[["r0",1]],[],[],3,0,1,1],[[["r0",1]],[],[],3,0,1,1],[[["r0",1]],[],[],2,0,1,1],[[["r2",17]],[],["r0"],0,32,1,0]]',
        '{"r0": 17, "r2": 2}',
    ),
    "async-preemption-only-pass": (
        '{"name":"async-preemption-only-pass","kv_tokens":384,"context_len":4096,"block_size":16,"max_num_seqs":8,"max_num_batched_tokens":8192,"enable_prefix_caching":true,"policy":"priority","async_scheduling":true,"requests":[{"rid":"r3","arrival_step":2,"prompt":[2169,20967,26286,13289,17238,16881,16271,20226,7320,24213,12441,16996,10163,18473,16902,22845,25426,6889,18667,25707,26195,6844,28736,25609,8299,8316,27831,7694,23532,526,1990,10156,24989,7870,4204,18497,12841,8251,9131,14365,5755,29199,10290,8579,19730,25328,23845,5146,10181,19934,1630,18046,5374,10043,18529,17013,7765,24854,231,4394,21745,27377,762,24182,14361,9549,25042,3219,10932,28546,5587,25495,28750,22552,25376,12533,20205,16755,1179,11626,5837,12370,6476,11227,10901,14023,4736,26223,9083,11718,23192,2523,1772,15564,11051,3806,2686,27379,21810,28879,26175,955,9507,17202,24791,3171,17156,29606,13340,17851,22946,5918,29543,25730,7070,12932,12876,3930,23322,24378,28994,1327,11079,4777,18398,6456,9435,16119,23302,17853,8637,11136,5454,17715,14041,10245,18219],"max_new_tokens":41,"ignore_eos":false,"eos_at":null,"priority":3},{"rid":"r11","arrival_step":23,"prompt":[2169,20967,26286,13289,17238,16881,16271,20226,7320,24213,12441,16996,10163,18473,16902,22845,25426,6889,18667,25707,26195,6844,28736,25609,8299,8316,27831,7694,23532,526,1990,10156,24989,7870,4204,18497,12841,8251,9131,14365,5755,29199,10290,8579,19730,25328,23845,5146,10181,19934,1630,18046,5374,10043,18529,17013,7765,24854,231,4394,21745,27377,762,24182,14361,9549,25042,3219,10932,28546,5587,25495,28750,22552,25376,12533,20205,16755,1179,11626,5837,12370,6476,11227,10901,14023,4736,26223,9083,11718,23192,2523,1772,15564,11051,3806,2686,27379,21810,28879,26175,955,9507,17202,24791,3171,17156,29606,13340,17851,22946,5918,29543,25730,7070,12932,12876,3930,23322,24378,10213,21489,21203,17762,17518,4989,2172,11934,3530],"max_new_tokens":17,"ignore_eos":true,"eos_at":null,"priority":2},{"rid":"r12","arrival_step":25,"prompt":[2169,20967,26286,13289,17238,16881,16271,20226,7320,24213,12441,16996,10163,18473,16902,22845,25426,6889,18667,25707,26195,6844,28736,25609,8299,8316,27831,7694,23532,526,1990,10156,24989,7870,4204,18497,12841,8251,9131,14365,5755,29199,10290,8579,19730,25328,23845,5146,10181,19934,1630,18046,5374,10043,18529,17013,7765,24854,231,4394,21745,27377,762,24182,14361,9549,25042,3219,10932,28546,5587,25495,28750,22552,25376,12533,20205,16755,1179,11626,5837,12370,6476,11227,10901,14023,4736,26223,9083,11718,23192,2523,1772,15564,11051,3806,2686,27379,21810,28879,26175,955,9507,17202,24791,3171,17156,29606,13340,17851,22946,5918,29543,25730,7070,12932,12876,3930,23322,24378,7094,18665,18909,28533,12160,2564,14210,28672],"max_new_tokens":17,"ignore_eos":true,"eos_at":null,"priority":1},{"rid":"r14","arrival_step":35,"prompt":[2169,20967,26286,13289,17238,16881,16271,20226,7320,24213,12441,16996,10163,18473,16902,22845,25426,6889,18667,25707,26195,6844,28736,25609,8299,8316,27831,7694],"max_new_tokens":8,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r15","arrival_step":40,"prompt":[2169,20967,26286,13289,17238,16881,16271,20226,7320,24213,12441,16996,10163,18473,16902,22845,25426,6889,18667,25707,26195,6844,28736,25609,8299,8316,27831,7694,23532,526,1990,10156,24989,7870,4204,18497,12841,8251,9131,14365,5755,29199,10290,8579,19730,25328,23845,5146,10181,19934,1630,18046,5374,10043,18529,17013,7765,24854,231,4394,21745,27377,762,24182,14361,9549,25042,3219,10932,28546,5587,25495,28750,22552,25376,12533,20205,16755,1179,11626,5837,12370,6476,11227,10901,14023,4736,26223,9083,11718,23192,2523,1772,15564,11051,3806,2686,27379,21810,28879,26175,955,9507,17202,24791,3171,17156,29606,13340,17851,22946,5918,29543,25730,7070,12932,12876,3930,23322,24378,7094,18665,18909,28533,12160,2564,14210,28672,1140,27658,5361,27673,23245,14981,14690,16906,1724,19561,1005,19936,10330,29103,15135,14965,23939,14367,20187,12629,3772,3779,3786,3793,3800,3807,3814,3821,24520,18049,2334,18660,20719,18533,29768,24036,16387,17111,12803,23380,9838,26801,15821,921,17167,12920,20712,19212,28789,1139,7570,11395,8068,15726,19648,17727,5647,26684,16989,3868,27993,29145,23944,17818,15768,4558,4565,4572,4579,4586,4593,4600,4607,16882,1872,7269,16122,28914,6041,5038,12680,3422,3429,3436,3443,3450,3457,3464,3471,3478,3485,3492,3499,3506,3513,3520,3527],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r16","arrival_step":40,"prompt":[2749,1401,12293,21106,29883,7530,12282,21798,2919,20523,5952,25981,20316,25778,5977,10644,17347],"max_new_tokens":2,"ignore_eos":true,"eos_at":null,"priority":1},{"rid":"r17","arrival_step":42,"prompt":[16114,11976,23446,26777,29036,1103,14245,3723,11367,10399,17135,27672,16239,26646,4086,3084,18537,3200,27425,12182,23798,2663,14873,1841,21164,29445,26156,5634,19055,16858,8334,2152,11046,18721,13502,25850,21869,10554,22021,16878,13809,25952,22100,14691,22013,21769,5929,8790,8057,17929,18538,25280,15653,7398,19897,18491,16246,23891,22059,18975,9879,27535,8700,16882,13328,2073,16881,25918,14344,29195,22002,15595,18125,22422,13173,24010,1406,15426,29727,10581,5595,27975,477,16145,20987,20976,11964,13989,21314,15647,2834,25195,21427,5615,29236,1467,17108,2430,27508,8159,23087,25651,17140,13608,11855,22774,1167,1261,26107,16828,20328,7022,7674,15438,9337,15071,10743,13932,10820,13242,21301,21875,22315,20668,14440,24343,29475,3389,19541,29697,24996,2990,7852,19583,29880,10852,15365,20569,23714,17258,5532,26834,13292,23935,19652,21079,11136,20161,24672,29472,9380,7736,5736,974,19508,16702,19332,16572,15157,23632,336,18154,5124,9502,3316,25934,8759,12462,28450,5241,29914,2318,27146,2422,4474,8004,742,12200,13975,24568,27430,13101,825,23179,13468,14287,28803,2737,180,8205,9508,10775,12299,10761,2598,12810,13686,4882,24433,21045,242,152,546,21166,7492,3783,12456,3163,28083,19334,23186,21128,13886,7995,10108,16113,29735,25067,17078,27051,16596,12033,18339,12209,4373,18784,28034,14941,11196,18938,5393,6143,13532,8732,24560,4427,20932,26405,27808,28426,27921,13489,5624,17983,27405,18390,27464,12998,2647,13670,15523,1796,1615,24132,25852,9862,14017,23799,13204,22586,2323,559,13061,17731,12049,9805,8370,27565,17391,14627,5261,2919,4604,20082,1151,12794,28496,14521,26848,5847,882,10976,20194,20741,5723,24082,28794,2779,25486,19537,3712,16561,15479,1783,3461,483,24323,22802,23645,28470,14957,28384,9251,29918,4084],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":2}]}',
        '[[[["r3",137]],[],[],15,0,1,0],[[["r3",1]],[],[],15,0,1,0],[[["r3",1]],[],[],15,0,1,0],[[["r3",1]],[],[],15,0,1,0],[[["r3",1]],[],[],15,0,1,0],[[["r3",1]],[],[],15,0,1,0],[[["r3",1]],[],[],15,0,1,0],[[["r3",1]],[],[],15,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1]],[],[],14,0,1,0],[[["r3",1],["r11",17]],[],[],12,112,2,0],[[["r3",1],["r11",1]],[],[],12,0,2,0],[[["r3",1],["r11",1],["r12",16]],[],[],11,112,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1]],[],[],9,0,3,0],[[["r3",1],["r11",1],["r12",1],["r14",12]],[],[],8,16,4,0],[[["r3",1],["r11",1],["r12",1],["r14",1]],[],[],8,0,4,0],[[["r3",1],["r11",1],["r12",1],["r14",1]],[],[],8,0,4,0],[[["r3",1],["r11",1],["r12",1],["r14",1]],[],[],8,0,4,0],[[["r3",1],["r11",1],["r12",1],["r14",1]],[],[],7,0,4,0],[[["r3",1],["r12",1],["r14",1]],[],[],6,0,4,2],[[["r3",1],["r12",1],["r14",1],["r15",97],["r16",17]],[],["r11"],0,128,5,0],[[["r14",1],["r16",1]],["r3"],["r12","r15"],19,0,2,2],[[["r17",305]],[],["r14","r16"],4,0,1,1],[[["r3",161]],[],["r17"],12,16,1,0]]',
        '{"r3": 41, "r11": 17, "r12": 17, "r14": 8, "r15": 1, "r16": 2, "r17": 1}',
    ),
}


def _ours(name: str):
    sc = VllmScenario.from_json(GOLDEN[name][0])
    return run_ours(sc)


def _steps(run) -> list:
    return [
        [[list(x) for x in s.reqs], s.preempted, s.finished, s.free_blocks, s.cache_hit_tokens, s.num_running, s.num_waiting]
        for s in run.steps
    ]


def _assert_steps(name: str, run) -> None:
    expected = json.loads(GOLDEN[name][1])
    got = _steps(run)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a == b, f"{name}: step {i}: ours {a}, vLLM {b}"
    assert len(got) == len(expected), f"{name}: {len(got)} steps, vLLM {len(expected)}"
    assert run.outputs == json.loads(GOLDEN[name][2])


def test_scenario_json_round_trip():
    sc = VllmScenario.from_json(GOLDEN["preempt-chunk"][0])
    assert VllmScenario.from_json(sc.to_json()) == sc


def test_preemption_chunking_and_prefix_hits_follow_vllm():
    """FCFS, 8-token budget, 8 blocks of 4: chunked prefills, a hit on a shared prompt block,
    two preemptions (the last admitted first), a resumed request hitting its own blocks."""
    run = _ours("preempt-chunk")
    assert run.error is None
    _assert_steps("preempt-chunk", run)


def test_async_priority_preemption_steps_follow_vllm():
    """The same under async scheduling and the priority policy (the lowest priority preempted)."""
    _assert_steps("preempt-chunk-async", _ours("preempt-chunk-async"))


def test_async_eos_stop_frees_each_block_once():
    for name in ("async-eos-double-free", "preempt-chunk-async"):
        assert _ours(name).error is None


def test_async_eos_stop_token_stays_out_of_the_cache():
    _assert_steps("async-eos-stop-token-cached", _ours("async-eos-stop-token-cached"))


def test_eviction_follows_vllms_free_block_queue():
    _assert_steps("eviction-order", _ours("eviction-order"))


def test_blocks_after_a_duplicate_are_cached():
    _assert_steps("duplicate-block-stops-caching", _ours("duplicate-block-stops-caching"))


def test_eviction_takes_one_block_at_a_time():
    _assert_steps("eviction-whole-leaf-after-preemption", _ours("eviction-whole-leaf-after-preemption"))


def test_under_async_a_pass_that_only_preempts_waits_for_the_step_in_flight():
    """Priority policy, async: a pass preempts a running request and schedules nothing. vLLM's
    engine then launches nothing and waits for the step in flight, whose output finishes two
    requests (freeing their blocks), before it schedules again; scheduling again at once (as a
    synchronous engine does) kept their blocks held and scheduled them once more."""
    _assert_steps("async-preemption-only-pass", _ours("async-preemption-only-pass"))
