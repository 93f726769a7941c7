"""The consumer's test: verify_attn imported from the wheel, CPU-side API only.

Checks that the package comes from the unpacked wheel (not a source tree),
that its metadata matches, builds a tree mask with ``masks.from_parents`` and
round-trips it through ``masks.to_dense``, runs ``reference_attention_paged``
on a small case against a plain loop written here, and (when the wheel was
built for this interpreter) loads the compiled extension.
"""

import glob
import math
import os
import sys
import unittest

import torch

import verify_attn
from verify_attn import masks


def ancestors(parents):
    """Dense ancestor-or-self matrix of one tree (parents local, -1 = root)."""
    n = len(parents)
    m = [[False] * n for _ in range(n)]
    for t in range(n):
        c = t
        while c >= 0:
            m[t][c] = True
            c = parents[c]
    return m


class ConsumerTest(unittest.TestCase):
    def test_imported_from_the_wheel(self):
        here = os.path.dirname(os.path.abspath(verify_attn.__file__))
        self.assertIn("verify_attn_wheel", here, "verify_attn not imported from @verify_attn_wheel: %s" % here)
        metas = glob.glob(os.path.join(os.path.dirname(here), "verify_attn-*.dist-info", "METADATA"))
        self.assertEqual(len(metas), 1, metas)
        with open(metas[0]) as f:
            meta = f.read()
        self.assertIn("Name: verify_attn", meta)
        self.assertIn("Version: %s" % verify_attn.__version__, meta)

    def test_masks_round_trip(self):
        trees = [[-1, 0, 0, 1, 2, 1], [-1, 0, 1], [-1]]
        parents = torch.tensor(sum(trees, []), dtype=torch.int32)
        qo = torch.tensor([0, 6, 9, 10], dtype=torch.int32)
        bits = masks.from_parents(parents, qo)
        self.assertEqual(tuple(bits.shape), (10, 1))
        dense = masks.to_dense(bits, qo)
        self.assertEqual(len(dense), 3)
        for tree, d in zip(trees, dense):
            self.assertEqual(d.tolist(), ancestors(tree))
        self.assertTrue(torch.equal(masks.from_dense(dense, qo), bits))

    def test_reference_attention_paged(self):
        g = torch.Generator().manual_seed(0)
        H, Hkv, D, ps = 4, 2, 16, 2
        trees = [[-1, 0, 0], [-1, 0]]
        prefix = [3, 4]
        q_lens = [len(t) for t in trees]
        kv_lens = [p + q for p, q in zip(prefix, q_lens)]
        pages = [(n + ps - 1) // ps for n in kv_lens]
        num_pages = sum(pages) + 2
        page_ids = torch.randperm(num_pages, generator=g)[: sum(pages)].to(torch.int32)
        kv_indptr = torch.tensor([0, pages[0], sum(pages)], dtype=torch.int32)
        qo = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32)
        kv_len = torch.tensor(kv_lens, dtype=torch.int32)
        q = torch.randn(sum(q_lens), H, D, generator=g)
        k = torch.randn(num_pages, ps, Hkv, D, generator=g)
        v = torch.randn(num_pages, ps, Hkv, D, generator=g)
        mask = masks.from_parents(torch.tensor(sum(trees, []), dtype=torch.int32), qo)
        scale = 0.25
        out, lse = verify_attn.reference_attention_paged(
            q, k, v, qo, kv_indptr, page_ids, kv_len, tree_mask=mask, sm_scale=scale)
        self.assertEqual(tuple(out.shape), (sum(q_lens), H, D))
        self.assertEqual(tuple(lse.shape), (sum(q_lens), H))
        # the same with a plain loop
        for i, tree in enumerate(trees):
            anc = ancestors(tree)
            rows = []
            for j in range(kv_lens[i]):
                p = int(page_ids[int(kv_indptr[i]) + j // ps])
                rows.append((k[p, j % ps].double(), v[p, j % ps].double()))
            for t in range(q_lens[i]):
                visible = list(range(prefix[i])) + [prefix[i] + c for c in range(q_lens[i]) if anc[t][c]]
                for h in range(H):
                    hk = h // (H // Hkv)
                    qv = q[int(qo[i]) + t, h].double()
                    logits = torch.stack([scale * (qv @ rows[j][0][hk]) for j in visible])
                    w = torch.softmax(logits, 0)
                    want = sum(w[n] * rows[j][1][hk] for n, j in enumerate(visible))
                    got = out[int(qo[i]) + t, h].double()
                    self.assertLess((got - want).abs().max().item(), 1e-9)
                    self.assertAlmostEqual(lse[int(qo[i]) + t, h].item(), torch.logsumexp(logits, 0).item(),
                                           places=9)

    def test_extension_loads_when_built_for_this_python(self):
        here = os.path.dirname(os.path.abspath(verify_attn.__file__))
        tag = "cp%d%d-cp%d%d" % (sys.version_info[:2] * 2)
        wheel_meta = glob.glob(os.path.join(os.path.dirname(here), "verify_attn-*.dist-info", "WHEEL"))
        with open(wheel_meta[0]) as f:
            tags = [line.split(":", 1)[1].strip() for line in f if line.startswith("Tag:")]
        self.assertTrue(os.path.exists(os.path.join(here, "_C.so")), "no _C.so in the wheel")
        if not any(t.startswith(tag) for t in tags):
            self.skipTest("wheel built for %s, this is %s" % (tags, tag))
        info = verify_attn.runtime_info()
        self.assertEqual(info["abi_version"], 7)
        self.assertGreaterEqual(info["cuda_runtime"], 13000)
        self.assertTrue(all(a.startswith("sm_") for a in info["compiled_archs"]), info)
        self.assertTrue(math.isfinite(info["cuda_driver"]))


if __name__ == "__main__":
    unittest.main()
