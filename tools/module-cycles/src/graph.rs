//! Cycles in the module graph: strongly connected groups of modules, each with one
//! shortest way round to show.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;

use crate::tree::ModuleTree;

/// Modules that all reach each other through their uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// Every module of the group, sorted.
    pub modules: Vec<String>,
    /// One shortest way round, from the first of `modules` back to it.
    pub example: Vec<String>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} modules in one cycle: {}",
            self.modules.len(),
            self.modules.join(", ")
        )?;
        write!(f, "  e.g. {}", self.example.join(" -> "))
    }
}

/// Every group of two or more modules that reach each other along `edges`.
pub fn cycles(tree: &ModuleTree, edges: &[BTreeSet<usize>]) -> Vec<Cycle> {
    strongly_connected(edges)
        .into_iter()
        .filter(|group| group.len() > 1)
        .map(|group| {
            let name = |m: &usize| tree.modules[*m].name.clone();
            let mut modules: Vec<String> = group.iter().map(name).collect();
            modules.sort();
            let start = group
                .iter()
                .copied()
                .min_by_key(|m| tree.modules[*m].name.clone())
                .unwrap_or_default();
            let example = way_round(edges, &group, start).iter().map(name).collect();
            Cycle { modules, example }
        })
        .collect()
}

/// Tarjan's algorithm, iterative (a deep module chain must not overflow the stack).
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<BTreeSet<usize>> {
    let n = edges.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut groups = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, its successors not yet looked at)
        let mut work: Vec<(usize, Vec<usize>)> = Vec::new();
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        work.push((root, edges[root].iter().rev().copied().collect()));
        while let Some((v, pending)) = work.last_mut() {
            let v = *v;
            if let Some(w) = pending.pop() {
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, edges[w].iter().rev().copied().collect()));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some((parent, _)) = work.last() {
                low[*parent] = low[*parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut group = BTreeSet::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    group.insert(w);
                    if w == v {
                        break;
                    }
                }
                groups.push(group);
            }
        }
    }
    groups
}

/// A shortest path from `start` back to itself inside `group` (breadth first).
fn way_round(edges: &[BTreeSet<usize>], group: &BTreeSet<usize>, start: usize) -> Vec<usize> {
    let mut previous: Vec<Option<usize>> = vec![None; edges.len()];
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in edges[v].iter().filter(|w| group.contains(w)) {
            if w == start {
                // Back from `v` to `start` along the search, then turned round.
                let mut path = vec![start, v];
                let mut at = v;
                while let Some(p) = previous[at] {
                    path.push(p);
                    at = p;
                }
                path.reverse();
                return path;
            }
            if previous[w].is_none() && w != start {
                previous[w] = Some(v);
                queue.push_back(w);
            }
        }
    }
    vec![start]
}
