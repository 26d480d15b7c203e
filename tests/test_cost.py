"""Cost model: the authors' calculator reproduced, hand-counted bills of materials, consistency properties."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis import cost


@pytest.mark.parametrize("link, ratio", [(100, 1.82), (400, 3.39)])
def test_calculator_basis_reproduces_spec_ratios(link, ratio):
    # spec §6.4: the calculator's defaults give fat-tree/MixNet cost 1.82 (100G) and 3.39 (400G), S=128, α=6
    c = cost.fabric_costs(128, link, basis="calculator")
    assert c["fat_tree"] / c["mixnet"] == pytest.approx(ratio, abs=0.005)


def test_fat_tree_hand_count_one_server():
    bom = cost.fat_tree_bom(1)
    # 8 NICs: edge 8 down + 8 up, aggregation 16, core 16 ports; transceivers = 48 + 8; fibers = 28
    assert bom == cost.BillOfMaterials(nics=8, transceivers=56, eps_ports=48, ocs_ports=0, fibers=28)
    p = cost.DEFAULT_PRICES[100]
    assert cost.bom_cost(bom, p) == pytest.approx(8 * 659 + 56 * 99 + 48 * 187 + 28 * 500 * 0.3)


def test_mixnet_hand_count_one_server_both_bases():
    spec = cost.mixnet_bom(1, alpha=6, basis="spec")
    # 2 EPS NICs: 12 tree ports; transceivers 12 + 8; OCS 6 ports; fibers ceil((12 + 2)/2) + 6
    assert spec == cost.BillOfMaterials(nics=8, transceivers=20, eps_ports=12, ocs_ports=6, fibers=13)
    calc = cost.mixnet_bom(1, alpha=6, basis="calculator")
    assert calc == cost.BillOfMaterials(nics=8, transceivers=20, eps_ports=0, ocs_ports=8, fibers=12)


@given(st.integers(1, 512), st.sampled_from([100, 200, 400, 800]))
def test_mixnet_without_ocs_is_the_fat_tree(servers, link):
    # α = 0 leaves every NIC on the EPS tree: the spec basis must price exactly the fat-tree
    p = cost.DEFAULT_PRICES[link]
    assert cost.bom_cost(cost.mixnet_bom(servers, alpha=0), p) == pytest.approx(
        cost.bom_cost(cost.fat_tree_bom(servers), p))


@given(st.integers(1, 256), st.integers(1, 7))
def test_costs_scale_linearly_and_mixnet_is_cheaper(servers, alpha):
    a = cost.fabric_costs(servers, 400, alpha=alpha)
    b = cost.fabric_costs(2 * servers, 400, alpha=alpha)
    assert b["fat_tree"] == pytest.approx(2 * a["fat_tree"])
    assert b["mixnet"] == pytest.approx(2 * a["mixnet"], abs=500 * 0.3 + 1e-6)   # ceil: one fiber at most
    assert a["mixnet"] < a["fat_tree"]


def test_cost_efficiency_and_errors():
    assert cost.cost_efficiency(2.0, 300.0, 2.5, 100.0) == pytest.approx(2.4)
    with pytest.raises(cost.CostInputError):
        cost.cost_efficiency(0, 1, 1, 1)
    with pytest.raises(cost.CostInputError):
        cost.prices_for(300)
    with pytest.raises(cost.CostInputError):
        cost.Prices(1, 1, -1, 1, 1, 1)
    with pytest.raises(cost.CostInputError):
        cost.mixnet_bom(4, basis="list-price")
    custom = {100: cost.Prices(0, 1, 0, 0, 0, 0)}
    assert cost.fabric_costs(3, 100, prices=custom)["mixnet"] == 24   # only NICs priced
