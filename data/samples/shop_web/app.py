"""A small Flask shop, part of the demo sources (`shop-web`): mtrag reads its routes with `ast`
(nothing here is imported or run), so `mtrag paths --from "POST /cart/items"` walks from the URL
to the handler and what it calls."""
from flask import Blueprint, Flask, jsonify, request

from shop_web.pricing import cart_total, price_of

app = Flask(__name__)
cart = Blueprint("cart", __name__, url_prefix="/cart")
CARTS: dict[str, list[dict]] = {}


def current_cart() -> list[dict]:
    """The caller's cart, made on first use."""
    return CARTS.setdefault(request.headers.get("X-Session", "anonymous"), [])


@app.get("/health")
def health():
    """Liveness probe for the load balancer."""
    return {"ok": True}


@cart.route("/items", methods=["POST"])
def add_item():
    """Add a product to the cart at its current price."""
    body = request.get_json()
    item = {"sku": body["sku"], "quantity": int(body.get("quantity", 1)), "price": price_of(body["sku"])}
    current_cart().append(item)
    return jsonify(item), 201


@cart.get("")
def show_cart():
    """The cart's items and its total with tax."""
    items = current_cart()
    return jsonify({"items": items, "total": cart_total(items)})


app.register_blueprint(cart)
