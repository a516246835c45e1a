//! One object table: the slots of a domain's objects of one kind (CQs,
//! counters, AVs, SRQs), with the rules every kind shares.
//!
//! - An object lives in a slot; its id is the slot's index, stable for its
//!   life. [`Table::insert`] takes the lowest free slot (ids of closed
//!   objects are reused), else appends.
//! - Whatever uses an object (an endpoint, a poll or wait set member)
//!   [`binds`](Slots::bind) it and [`unbinds`](Table::unbind) it when done.
//!   Binding a free slot is `Inval`: the object is closed.
//! - [`Table::close`] while bound is `Busy` (the message gives the count);
//!   unbound, it frees the slot and hands the state back for its last rites.
//! - A handle dropped while its object is bound [`orphans`](Table::orphan)
//!   it: the state stays for those bound (their completions still go
//!   there) and is freed at the last unbind.
//!
//! The table derefs to [`Slots`] (as `Vec` to a slice): lookups and
//! binding, never a slot freed or added. That is what a progress context
//! holds: a progress pass finds a CQ by id on every message, and
//! [`Slots::get_mut`] costs what indexing a `[Option<T>]` did, a bounds
//! check and a discriminant test through one fat pointer (each entry is 8
//! bytes longer, for its bind count and orphan flag).
//!
//! A new kind of object (memory regions, deferred work, collectives) is its
//! state type naming itself, one field in `DomainState` and its
//! `Table::new()` where the domain is made:
//!
//! ```text
//! pub(crate) struct MrState { /* ... */ }
//! impl Object for MrState {
//!     const NAME: &'static str = "memory region";
//!     const BOUND_BY: &'static str = "endpoints";
//! }
//!
//! // DomainState:        pub mrs: Table<MrState>,
//! // Fabric::domain_with: mrs: Table::new(),
//! //
//! // open:   let id = st.mrs.insert(MrState { .. });
//! // bind:   st.mrs.bind(id)?;             (with the binder's record of id)
//! // unbind: st.mrs.unbind(id);            (frees an orphan at the last one)
//! // close:  let mr = st.mrs.close(id)?;   (Busy while bound)
//! // drop:   if handle.close().is_err() { st.mrs.orphan(id) }
//! ```

use crate::error::{Error, ErrorKind, Result};

/// A kind of object kept in a [`Table`].
pub(crate) trait Object {
    /// What the object is called in error messages ("CQ", "counter").
    const NAME: &'static str;
    /// What binds it, for the `Busy` message ("endpoints").
    const BOUND_BY: &'static str;
}

/// A live object and its bookkeeping.
struct Entry<T> {
    val: T,
    /// Bindings held on the object (endpoints, poll and wait set members).
    /// `close` is `Busy` while this is above 0.
    bound: usize,
    /// The handle was dropped while `bound > 0`: the object can no longer
    /// be closed, and the last `unbind` frees it. Never set while
    /// `bound == 0` (`orphan` frees at once then).
    orphaned: bool,
}

/// The lookup half of a [`Table`]: its slots, by id (see the module docs).
/// Unsized, as `[T]` is: held as `&Slots<T>` / `&mut Slots<T>`, one fat
/// pointer.
#[repr(transparent)]
pub(crate) struct Slots<T>([Option<Entry<T>>]);

impl<T: Object> Slots<T> {
    #[inline(always)]
    fn from_slice(s: &[Option<Entry<T>>]) -> &Self {
        // SAFETY: Slots is repr(transparent) over the slice, so the fat
        // pointer's address and length mean the same for both types.
        unsafe { &*(s as *const [Option<Entry<T>>] as *const Slots<T>) }
    }

    #[inline(always)]
    fn from_slice_mut(s: &mut [Option<Entry<T>>]) -> &mut Self {
        // SAFETY: as in from_slice; the borrow is moved, not copied.
        unsafe { &mut *(s as *mut [Option<Entry<T>>] as *mut Slots<T>) }
    }

    /// The live (open or orphaned) object `id`; None when its slot is free
    /// or past the end.
    #[inline(always)]
    pub fn get(&self, id: usize) -> Option<&T> {
        match self.0.get(id) {
            Some(Some(e)) => Some(&e.val),
            _ => None,
        }
    }

    /// The live object `id`, with no test: for a caller that knows it is
    /// live (an open handle's object, checked open under the domain lock).
    ///
    /// # Safety
    /// Slot `id` exists and holds an object.
    #[inline(always)]
    pub unsafe fn get_live_mut(&mut self, id: usize) -> &mut T {
        debug_assert!(matches!(self.0.get(id), Some(Some(_))));
        // SAFETY: the caller's contract.
        unsafe { &mut self.0.get_unchecked_mut(id).as_mut().unwrap_unchecked().val }
    }

    /// As [`Slots::get`], mutable.
    #[inline(always)]
    pub fn get_mut(&mut self, id: usize) -> Option<&mut T> {
        match self.0.get_mut(id) {
            Some(Some(e)) => Some(&mut e.val),
            _ => None,
        }
    }

    /// Binds object `id` once; returns it (for the binder's own record).
    /// `Inval` when it is closed (free slot). An orphan can still be bound
    /// (it is live; it is freed at its last unbind all the same).
    #[inline]
    pub fn bind(&mut self, id: usize) -> Result<&mut T> {
        self.bind_n(id, 1)
    }

    /// Binds object `id` `n` times (one binder holding it for two roles).
    pub fn bind_n(&mut self, id: usize, n: usize) -> Result<&mut T> {
        match self.0.get_mut(id) {
            Some(Some(e)) => {
                e.bound += n;
                Ok(&mut e.val)
            }
            _ => Err(Error::with(ErrorKind::Inval, format!("{} is closed", T::NAME))),
        }
    }

    /// The live objects with their ids, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.0.iter().enumerate().filter_map(|(i, e)| e.as_ref().map(|e| (i, &e.val)))
    }
}

/// The slots of a domain's objects of one kind (see the module docs).
pub(crate) struct Table<T> {
    /// Slot `id` holds object `id` or is free (None). Free slots are
    /// reused lowest first; the vector never shrinks, so an id stays valid
    /// (in range) for the table's life.
    slots: Vec<Option<Entry<T>>>,
}

impl<T: Object> Table<T> {
    /// An empty table.
    pub const fn new() -> Self {
        Table { slots: Vec::new() }
    }

    /// The id the next [`Table::insert`] gives.
    pub fn next_id(&self) -> usize {
        self.slots.iter().position(Option::is_none).unwrap_or(self.slots.len())
    }

    /// Adds an object, unbound; returns its id (see [`Table::next_id`]).
    pub fn insert(&mut self, val: T) -> usize {
        let id = self.next_id();
        let e = Some(Entry { val, bound: 0, orphaned: false });
        if id == self.slots.len() {
            self.slots.push(e);
        } else {
            self.slots[id] = e;
        }
        id
    }

    /// Releases one binding of object `id`; frees it if it was orphaned and
    /// this was its last binding. Nothing happens when the slot is free.
    pub fn unbind(&mut self, id: usize) {
        let Some(Some(e)) = self.slots.get_mut(id) else { return };
        debug_assert!(e.bound > 0, "{} {id} unbound more often than bound", T::NAME);
        e.bound = e.bound.saturating_sub(1);
        if e.bound == 0 && e.orphaned {
            self.slots[id] = None;
        }
    }

    /// Closes object `id`: frees its slot and returns its state. `Busy`
    /// while it is bound; `Inval` when it is closed already.
    pub fn close(&mut self, id: usize) -> Result<T> {
        let closed = || Error::with(ErrorKind::Inval, format!("{} is closed", T::NAME));
        let Some(Some(e)) = self.slots.get(id) else { return Err(closed()) };
        if e.orphaned {
            return Err(closed());
        }
        if e.bound > 0 {
            return Err(Error::with(
                ErrorKind::Busy,
                format!(
                    "{} is still bound {} time(s) (by {}): close or unbind those first",
                    T::NAME,
                    e.bound,
                    T::BOUND_BY
                ),
            ));
        }
        Ok(self.slots[id].take().expect("live").val)
    }

    /// The handle of object `id` is gone: frees it now if nothing is bound,
    /// else when the last binding goes. Nothing happens when the slot is
    /// free.
    pub fn orphan(&mut self, id: usize) {
        let Some(Some(e)) = self.slots.get_mut(id) else { return };
        if e.bound == 0 {
            self.slots[id] = None;
        } else {
            e.orphaned = true;
        }
    }
}

impl<T: Object> std::ops::Deref for Table<T> {
    type Target = Slots<T>;
    #[inline(always)]
    fn deref(&self) -> &Slots<T> {
        Slots::from_slice(&self.slots)
    }
}

impl<T: Object> std::ops::DerefMut for Table<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Slots<T> {
        Slots::from_slice_mut(&mut self.slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Thing(u32);
    impl Object for Thing {
        const NAME: &'static str = "thing";
        const BOUND_BY: &'static str = "others";
    }

    fn kind<T>(r: Result<T>) -> ErrorKind {
        r.err().expect("an error").kind()
    }

    #[test]
    fn free_slots_are_reused_lowest_first() {
        let mut t = Table::new();
        let ids: Vec<usize> = (0..4).map(|i| t.insert(Thing(i))).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
        t.close(2).unwrap();
        t.close(1).unwrap();
        assert_eq!(t.next_id(), 1);
        assert_eq!(t.insert(Thing(10)), 1);
        assert_eq!(t.insert(Thing(20)), 2);
        assert_eq!(t.insert(Thing(30)), 4);
        assert_eq!(t.iter().map(|(i, v)| (i, v.0)).collect::<Vec<_>>(), [(0, 0), (1, 10), (2, 20), (3, 3), (4, 30)]);
    }

    #[test]
    fn ids_stay_put_while_others_come_and_go() {
        let mut t = Table::new();
        let a = t.insert(Thing(1));
        let b = t.insert(Thing(2));
        for round in 0..5 {
            let c = t.insert(Thing(100 + round));
            t.close(c).unwrap();
            assert_eq!(t.get(a), Some(&Thing(1)));
            assert_eq!(t.get(b), Some(&Thing(2)));
        }
        t.close(a).unwrap();
        assert_eq!(t.get(b), Some(&Thing(2)), "b keeps its id when a goes");
        t.get_mut(b).unwrap().0 = 7;
        assert_eq!(t.get(b), Some(&Thing(7)));
        assert_eq!(t.get(99), None, "past the end");
    }

    #[test]
    fn close_while_bound_is_busy_and_names_the_count() {
        let mut t = Table::new();
        let id = t.insert(Thing(1));
        t.bind(id).unwrap();
        t.bind_n(id, 2).unwrap();
        let e = t.close(id).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert!(e.to_string().contains("thing is still bound 3 time(s) (by others)"), "{e}");
        assert_eq!(t.get(id), Some(&Thing(1)), "a refused close changes nothing");
        for left in [2, 1] {
            t.unbind(id);
            assert!(t.close(id).unwrap_err().to_string().contains(&format!("bound {left} time(s)")));
        }
        t.unbind(id);
        assert_eq!(t.close(id).unwrap(), Thing(1));
        assert_eq!(t.get(id), None);
    }

    #[test]
    fn double_close_is_inval() {
        let mut t = Table::new();
        let id = t.insert(Thing(1));
        t.close(id).unwrap();
        assert_eq!(kind(t.close(id)), ErrorKind::Inval);
        assert_eq!(kind(t.close(42)), ErrorKind::Inval, "never opened");
    }

    #[test]
    fn binding_a_closed_object_is_inval() {
        let mut t = Table::new();
        let id = t.insert(Thing(1));
        t.close(id).unwrap();
        assert_eq!(kind(t.bind(id)), ErrorKind::Inval);
        assert_eq!(kind(t.bind(7)), ErrorKind::Inval, "past the end");
        let id = t.insert(Thing(2));
        t.bind(id).unwrap();
        t.orphan(id);
        assert_eq!(kind(t.close(id)), ErrorKind::Inval, "orphaned: closed from the API's side");
        assert_eq!(t.get(id), Some(&Thing(2)), "still there for its binder");
    }

    #[test]
    fn an_orphan_bound_again_waits_for_that_binding_too() {
        let mut t = Table::new();
        let id = t.insert(Thing(1));
        t.bind(id).unwrap();
        t.orphan(id);
        t.bind(id).unwrap();
        t.unbind(id);
        assert_eq!(t.get(id), Some(&Thing(1)), "the later binding holds it");
        t.unbind(id);
        assert_eq!(t.get(id), None);
    }

    #[test]
    fn orphan_is_freed_at_the_last_unbind() {
        let mut t = Table::new();
        let id = t.insert(Thing(1));
        t.bind(id).unwrap();
        t.bind(id).unwrap();
        t.orphan(id);
        t.unbind(id);
        assert_eq!(t.get(id), Some(&Thing(1)), "one binding left");
        t.unbind(id);
        assert_eq!(t.get(id), None, "freed with the last binding");
        assert_eq!(t.insert(Thing(2)), id, "its slot is free again");
        t.unbind(5); // a free slot: nothing happens
    }

    #[test]
    fn orphan_of_an_unbound_object_frees_it_at_once() {
        let mut t = Table::new();
        let id = t.insert(Thing(1));
        t.orphan(id);
        assert_eq!(t.get(id), None);
        t.orphan(id); // free: nothing happens
        assert_eq!(t.next_id(), id);
    }

    #[test]
    fn an_unbound_object_that_is_not_orphaned_stays() {
        let mut t = Table::new();
        let id = t.insert(Thing(1));
        t.bind(id).unwrap();
        t.unbind(id);
        assert_eq!(t.get(id), Some(&Thing(1)), "only orphans are freed by unbind");
        assert_eq!(t.close(id).unwrap(), Thing(1));
    }
}
