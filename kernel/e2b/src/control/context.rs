//! One request's view of the face: the face itself, and the calling
//! key's tenant.

use super::shapes::SandboxAccess;
use crate::face::Face;
use crate::tenant::Tenant;
use crate::tokens::Purpose;

/// One request's view: the face, and the key's tenant.
pub struct Control<'a> {
    pub face: &'a Face,
    pub tenant: Tenant,
}

impl Control<'_> {
    /// What create and connect answer for the tenant's sandbox `id`.
    pub fn access(&self, id: String, template_id: String) -> SandboxAccess {
        let tokens = &self.face.tokens;
        let token = tokens.mint(self.tenant.delegate, &id);
        let traffic = tokens.mint_for(Purpose::Traffic, self.tenant.delegate, &id);
        SandboxAccess::new(id, template_id, token, traffic)
    }
}
