"""Prices and totals for the demo shop (data/samples/shop_web/app.py)."""

PRICES = {"book": 12.5, "mug": 8.0, "poster": 15.0}
TAX_RATE = 0.2


def price_of(sku: str) -> float:
    """The unit price of a product; unknown products are refused."""
    if sku not in PRICES:
        raise KeyError(f"unknown product {sku!r}")
    return PRICES[sku]


def with_tax(amount: float) -> float:
    """An amount with the shop's sales tax added, rounded to cents."""
    return round(amount * (1 + TAX_RATE), 2)


def cart_total(items: list[dict]) -> float:
    """The cart's total with tax: each item's price times its quantity."""
    return with_tax(sum(item["price"] * item["quantity"] for item in items))
