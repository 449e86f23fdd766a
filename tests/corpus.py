"""A small, realistic two-source corpus written by the tests: a Python package and its docs."""
from __future__ import annotations

import textwrap
from pathlib import Path

TAX_PY = '''\
"""Tax rules for the cart."""
from .rates import RATES


def lookup_rate(region: str) -> float:
    """Look up the tax rate (税率) for a region code."""
    return RATES.get(region, 0.0)


def apply_tax(amount: float, region: str) -> float:
    """Apply the regional tax to an amount and round to cents."""
    return round(amount * (1 + lookup_rate(region)), 2)
'''

RATES_PY = '''\
"""Rate table."""
RATES = {"eu": 0.2, "us": 0.07}
'''

CART_PY = '''\
"""The shopping cart."""
from .tax import apply_tax


class BaseCart:
    """Common cart behaviour."""

    def item_count(self) -> int:
        """Number of items in the cart."""
        return len(self.items)


class Cart(BaseCart):
    """A cart of priced items for one region."""

    def __init__(self, region: str):
        self.region = region
        self.items = []

    def add(self, price: float) -> None:
        """Add an item by price."""
        self.items.append(price)

    def total(self) -> float:
        """Total price including tax."""
        return apply_tax(sum(self.items), self.region)
'''

GUIDE_MD = '''\
# Shopcart guide

Shopcart computes cart totals with regional taxes. Use :func:`shopcart.tax.apply_tax` to add tax
to an amount, and :meth:`shopcart.cart.Cart.item_count` to count items.

## Totals

Call `Cart.total()` to get the total. 税率由地区决定，总价包含税费。

## API

.. autoclass:: shopcart.cart.Cart
'''


def write_corpus(root: Path) -> dict[str, Path]:
    pkg = root / "shop" / "src" / "shopcart"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Shopcart: carts and taxes."""\n')
    (pkg / "tax.py").write_text(TAX_PY)
    (pkg / "rates.py").write_text(RATES_PY)
    (pkg / "cart.py").write_text(CART_PY)
    docs = root / "shop-docs"
    docs.mkdir()
    (docs / "guide.md").write_text(GUIDE_MD)
    (docs / "notes.md").write_text("# Notes\n\nRounding happens to cents.\n")
    sources = root / "sources.yaml"
    sources.write_text(textwrap.dedent("""\
        sources:
          - {id: shop, kind: code, path: shop, include: ["src/**/*.py"]}
          - {id: shop-docs, kind: docs, path: shop-docs}
        """))
    return {"root": root, "pkg": pkg, "docs": docs, "sources": sources}
