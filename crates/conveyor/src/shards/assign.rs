//! Which replica holds which shard: a pure function of the live members and the number
//! of shards, so that every replica computes the same plan from the same view, with no
//! coordinator.

use std::collections::{BTreeMap, BTreeSet};

/// Spreads `shards` shards (numbered `0..shards`) over `members`, evenly and stably.
///
/// Every member gets `shards / n` or `shards / n + 1` of them (`n` members): 4 each for
/// 12 shards over 3 members, 6 each over 2. Ties are broken by rendezvous hashing: each
/// (member, shard) pair has a weight from a hash that is the same in every process and
/// run, and the pairs are taken heaviest first while the member has room. So the plan
/// depends on the set of members alone (not on their order), and a change of members
/// moves few shards besides those it must (the shards of a member that left, or those a
/// new member takes): with 12 shards over 3 members, about one shard in two changes of
/// members, on average, to even out the rest.
///
/// An empty set of members holds nothing.
///
/// ```
/// use std::collections::BTreeSet;
/// use conveyor::shards::assign;
///
/// let members: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
/// let plan = assign(&members, 12);
/// assert!(plan.values().all(|held| held.len() == 4));
/// ```
pub fn assign(members: &BTreeSet<String>, shards: usize) -> BTreeMap<String, Vec<usize>> {
    let mut plan: BTreeMap<String, Vec<usize>> = members
        .iter()
        .map(|member| (member.clone(), Vec::new()))
        .collect();
    let count = members.len();
    if count == 0 {
        return plan;
    }
    let floor = shards / count;
    // How many members may hold one more than `floor`.
    let mut above_floor = shards % count;
    let mut pairs: Vec<(u64, &str, usize)> = members
        .iter()
        .flat_map(|member| {
            (0..shards).map(move |shard| (weight(member, shard), member.as_str(), shard))
        })
        .collect();
    // Heaviest first; the member and the shard break ties, so the order is total.
    pairs.sort_unstable_by(|a, b| b.cmp(a));
    let mut taken = vec![false; shards];
    for (_, member, shard) in pairs {
        if taken.get(shard).copied().unwrap_or(true) {
            continue;
        }
        let Some(held) = plan.get_mut(member) else {
            continue;
        };
        let has_room = held.len() < floor || (held.len() == floor && above_floor > 0);
        if !has_room {
            continue;
        }
        if held.len() == floor {
            above_floor -= 1;
        }
        held.push(shard);
        if let Some(slot) = taken.get_mut(shard) {
            *slot = true;
        }
    }
    for held in plan.values_mut() {
        held.sort_unstable();
    }
    plan
}

/// The shards `member` holds in [`assign`]'s plan for `members` (none if it is not one of
/// them).
pub fn assigned_to(member: &str, members: &BTreeSet<String>, shards: usize) -> Vec<usize> {
    assign(members, shards).remove(member).unwrap_or_default()
}

/// The rendezvous weight of `shard` for `member`: FNV-1a over the member's bytes and the
/// shard number, then SplitMix64's finaliser, so that close names still spread. Stable
/// across processes, platforms and releases (changing it would move shards between
/// replicas of two versions running side by side).
fn weight(member: &str, shard: usize) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let shard = u64::try_from(shard).unwrap_or(u64::MAX);
    for byte in member.bytes().chain([0xff]).chain(shard.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    fn counts(plan: &BTreeMap<String, Vec<usize>>) -> Vec<usize> {
        plan.values().map(Vec::len).collect()
    }

    #[test]
    fn every_shard_is_held_by_exactly_one_member_and_the_spread_is_even() {
        for count in 1..=7 {
            let names: Vec<String> = (0..count).map(|i| format!("replica-{i}")).collect();
            let set: BTreeSet<String> = names.iter().cloned().collect();
            for shards in 0..=40 {
                let plan = assign(&set, shards);
                let mut all: Vec<usize> = plan.values().flatten().copied().collect();
                all.sort_unstable();
                assert_eq!(
                    all,
                    (0..shards).collect::<Vec<_>>(),
                    "{count} members, {shards} shards"
                );
                let (low, high) = (shards / count, shards.div_ceil(count));
                assert!(
                    counts(&plan).iter().all(|&n| n == low || n == high),
                    "{count} members, {shards} shards: {plan:?}"
                );
            }
        }
    }

    #[test]
    fn twelve_shards_go_four_to_each_of_three_and_six_to_each_of_two() {
        assert_eq!(counts(&assign(&members(&["a", "b", "c"]), 12)), [4, 4, 4]);
        assert_eq!(counts(&assign(&members(&["a", "c"]), 12)), [6, 6]);
    }

    #[test]
    fn the_plan_depends_on_the_set_of_members_alone() {
        let one = assign(&members(&["x", "y", "z"]), 12);
        let other = assign(&members(&["z", "x", "y"]), 12);
        assert_eq!(one, other);
        assert_eq!(assigned_to("y", &members(&["x", "y", "z"]), 12), one["y"]);
        assert!(assigned_to("w", &members(&["x", "y", "z"]), 12).is_empty());
    }

    /// Shards that change hands when `before` becomes `after`, other than those that must
    /// (held by a member that left, or by nobody before).
    fn needless_moves(before: &BTreeSet<String>, after: &BTreeSet<String>, shards: usize) -> usize {
        let old = assign(before, shards);
        let new = assign(after, shards);
        let owner = |plan: &BTreeMap<String, Vec<usize>>, shard: usize| {
            plan.iter()
                .find(|(_, held)| held.contains(&shard))
                .map(|(member, _)| member.clone())
        };
        (0..shards)
            .filter(|&shard| {
                let (was, is) = (owner(&old, shard), owner(&new, shard));
                was.as_ref().is_some_and(|was| after.contains(was)) && was != is
            })
            .count()
    }

    #[test]
    fn a_member_leaving_moves_little_besides_its_own_shards() {
        // Over many sets of names: when one of three leaves, its 4 shards must move; the
        // survivors' own shards move rarely (to even out the rest).
        let mut needless = 0;
        let rounds = 200;
        for round in 0..rounds {
            let all = members(&[
                &format!("a{round}"),
                &format!("b{round}"),
                &format!("c{round}"),
            ]);
            let gone = all.iter().next().cloned().unwrap_or_default();
            let rest: BTreeSet<String> = all.iter().filter(|m| **m != gone).cloned().collect();
            needless += needless_moves(&all, &rest, 12);
        }
        // 12 shards, 8 of them held by survivors: on average fewer than one moves (about
        // one in two when measured).
        assert!(
            needless <= rounds,
            "{needless} needless moves over {rounds} rounds"
        );
    }

    #[test]
    fn a_member_joining_takes_its_share_and_little_else_moves() {
        let mut needless = 0;
        let rounds = 200;
        for round in 0..rounds {
            let before = members(&[&format!("a{round}"), &format!("b{round}")]);
            let mut after = before.clone();
            after.insert(format!("new{round}"));
            let plan = assign(&after, 12);
            assert_eq!(plan[&format!("new{round}")].len(), 4);
            // The 4 the newcomer takes must move; count the survivors' shards swapped
            // among themselves.
            let old = assign(&before, 12);
            for (member, held) in &plan {
                if let Some(had) = old.get(member) {
                    needless += held.iter().filter(|shard| !had.contains(shard)).count();
                }
            }
        }
        // About one in two when measured.
        assert!(
            needless <= rounds,
            "{needless} needless moves over {rounds} rounds"
        );
    }
}
